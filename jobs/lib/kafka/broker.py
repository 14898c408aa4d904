"""Driver-side Kafka access: topic metadata, watermarks and consumer-group commits.

Runs on the driver only, in the long-lived Python process that serves the streaming engine, so
one admin client and one committing consumer serve every micro-batch. Nothing here is pickled.
Group commits are a courtesy for lag tools: the Spark checkpoint is the truth about progress.
Metadata and offset requests ride out an unreachable broker for brokerOutageSeconds
(`jobs.lib.kafka.outage`); bad input fails at once.
"""

from __future__ import annotations

import logging
import time
from typing import Mapping, Sequence

from jobs.lib.kafka.options import SourceSettings
from jobs.lib.kafka.outage import Outage, is_bad_input, is_unavailable
from jobs.lib.kafka.planning import TP, Watermarks, offsets_to_map
from orchestrator.core.exceptions import SourceError

__all__ = ["Broker", "commit_group_offsets"]

log = logging.getLogger("kappa.source")


class Broker:
    """Driver-side Kafka access (metadata, watermarks, group commits). Not picklable; created lazily."""

    def __init__(self, settings: SourceSettings):
        from confluent_kafka.admin import AdminClient

        self.settings = settings
        self.admin = AdminClient(settings.admin_config())
        self._committer = None
        self.commit_failed = False  # set by the commit callback; the next commit then retries

    def _new_admin(self) -> None:
        """A fresh AdminClient after an outage: one that saw a broker restart can keep its partitions'
        leaders unknown in its metadata cache and answer "No leaders found" long after the broker is back
        (seen on Apache Kafka: 120 s of it, then the job failed)."""
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient(self.settings.admin_config())

    def _retry(self, what: str, fn, attempts: int = 3):
        """`fn()`, retried: while the broker is unavailable (`jobs.lib.kafka.outage`) with backoff
        for brokerOutageSeconds; other Kafka errors `attempts` times; bad input (a SourceError
        from `fn`, authentication, authorization, a bad setting) not at all."""
        last: Exception | None = None
        outage: Outage | None = None
        failures = 0
        while True:
            try:
                result = fn()
            except SourceError:
                raise
            except Exception as e:  # KafkaException, timeouts
                last = e
                if is_bad_input(e):
                    raise SourceError(f"cannot {what} from Kafka at {self.settings.bootstrap_servers}: {e}; check "
                                      f"the kafka.* security options and settings") from None
                if is_unavailable(e):
                    outage = outage or Outage(self.settings, what)
                    outage.wait(e)  # raises once brokerOutageSeconds have passed
                    self._new_admin()
                    continue
                failures += 1
                if failures >= attempts:
                    break
                time.sleep(0.5 * failures)
                continue
            if outage is not None:
                log.info("Kafka at %s answers again after %.0f s: %s", self.settings.bootstrap_servers,
                         outage.elapsed(), what)
            return result
        raise SourceError(f"cannot {what} from Kafka at {self.settings.bootstrap_servers} after "
                          f"{attempts} attempts: {last}; check that the broker is reachable and the "
                          f"kafka.* security options are right") from None

    def partitions(self, required: bool) -> list[TP]:
        """Every partition of the configured topics. ``required``: a missing topic is an error."""
        def fetch():
            md = self.admin.list_topics(timeout=10)
            out: list[TP] = []
            for t in self.settings.topics:
                tm = md.topics.get(t)
                if tm is None or tm.error is not None or not tm.partitions:
                    if required:
                        known = sorted(x for x in md.topics if not x.startswith("__"))[:20]
                        raise SourceError(
                            f"topic {t!r} does not exist on {self.settings.bootstrap_servers} "
                            f"(error: {tm.error if tm else 'unknown topic'}); create it first or fix the "
                            f"topics option. Topics there: {known}")
                    log.warning("topic %s is not visible in the metadata now; keeping its offsets", t)
                    continue
                out.extend((t, p) for p in sorted(tm.partitions))
            return out
        return self._retry("read topic metadata", fetch)

    def watermarks(self, tps: Sequence[TP], tolerate: bool = False) -> dict[TP, Watermarks]:
        """Log start and end (last stable offset under read_committed) of each partition.

        ``tolerate``: partitions whose offsets cannot be listed right now (no leader yet, say) are
        left out with a warning instead of failing, as long as some partition answered.
        """
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        if not tps:
            return {}
        iso = (IsolationLevel.READ_COMMITTED if self.settings.isolation_level == "read_committed"
               else IsolationLevel.READ_UNCOMMITTED)

        def fetch(spec):
            req = {TopicPartition(t, p): spec for t, p in tps}
            futures = self.admin.list_offsets(req, isolation_level=iso, request_timeout=15)
            ok: dict[TP, int] = {}
            bad: dict[TP, Exception] = {}
            for k, f in futures.items():
                try:
                    ok[(k.topic, k.partition)] = f.result().offset
                except Exception as e:
                    bad[(k.topic, k.partition)] = e
            if bad and (not tolerate or not ok):
                tp, e = min(bad.items(), key=lambda item: item[0])
                raise RuntimeError(f"{tp[0]}[{tp[1]}]: {e}") from e  # the cause tells an outage
            return ok, bad

        low, bad_low = self._retry("list earliest offsets", lambda: fetch(OffsetSpec.earliest()))
        high, bad_high = self._retry("list latest offsets", lambda: fetch(OffsetSpec.latest()))
        skipped = sorted(set(bad_low) | set(bad_high))
        if skipped:
            log.warning("offsets of %s cannot be listed now (%s); leaving them out of this micro-batch",
                        skipped, (bad_low or bad_high)[skipped[0]])
        return {tp: Watermarks(max(0, low[tp]), max(0, high[tp])) for tp in tps
                if tp in low and tp in high}

    def commit_group(self, group_id: str, offsets: Mapping[TP, int], wait: bool = False) -> None:
        """Commit offsets to ``group_id``. Asynchronous unless ``wait``: a slow or absent group
        coordinator must never stall the query (failures are logged when the result comes back)."""
        from confluent_kafka import Consumer, TopicPartition

        if self._committer is None:
            conf = self.settings.consumer_config(group_id)
            conf["on_commit"] = self._on_commit
            self._committer = Consumer(conf)
        self._committer.poll(0)  # serves the callbacks of earlier commits
        tps = [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
        if wait:
            self._committer.commit(offsets=tps, asynchronous=False)
        else:
            self._committer.commit(offsets=tps, asynchronous=True)

    def _on_commit(self, err, partitions) -> None:
        bad = [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in partitions or [] if tp.error is not None]
        if err is not None or bad:
            self.commit_failed = True
            log.warning("consumer-group commit failed (lag tools will lag behind; the Spark checkpoint "
                        "is unaffected): %s", err or ", ".join(bad))

    def close(self) -> None:
        if self._committer is not None:
            try:
                self._committer.poll(1)
                self._committer.close()
            except Exception:
                pass
            self._committer = None


def commit_group_offsets(bootstrap_servers: str, group_id: str, offsets: Mapping[str, Mapping[str, int]],
                         kafka_config: Mapping[str, str] | None = None) -> None:
    """Commit Spark offset JSON to a consumer group (the runtime does it once more at the end)."""
    settings = SourceSettings(bootstrap_servers=bootstrap_servers, topics=tuple(offsets) or ("-",),
                              kafka=tuple(sorted((k, str(v)) for k, v in (kafka_config or {}).items())))
    b = Broker(settings)
    try:
        b.commit_group(group_id, offsets_to_map(offsets), wait=True)
    finally:
        b.close()
