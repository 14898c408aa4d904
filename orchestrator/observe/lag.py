"""How far a version's job is behind its source topics.

Per partition: lag = log end offset (the broker's high watermark) - the version's next offset to
read. The next offset comes from the job's Spark checkpoint (the end offsets of its last
committed micro-batch, which is the truth the job restarts from); the consumer group's committed
offsets (which the job commits after each batch, so any Kafka lag tool sees it) are read too, as
a cross-check and as the fallback when the checkpoint is not readable from here. A version whose
job has not committed a batch yet has read nothing: its next offset is the log start, and its lag
is the whole log. Lag that cannot be read (broker down, topic gone) is unknown (None), never 0.

A next offset past the log end (the topic was deleted and recreated, or truncated, after the job
read it) is not "ahead": the offsets the version read no longer exist. Such a partition's lag is
clamped to 0 in `details` (a negative lag would cancel real lag on another partition in the
total) and shown as unknown, the reading's total is unknown (so it never counts as caught up or
ready), and `error` says what happened and what to do: deploy a new version, which reads the log
as it is now from offset zero.

While a new version's backfill runs (its first micro-batch reads the whole log as one Spark
batch, and nothing is committed until all of it is processed), the checkpoint and the consumer
group still say "nothing processed". The batch's reader tasks report how far they have read
(`jobs.lib.source.read_progress`); a version without a committed batch takes its next offsets from
there (source "reading"): its lag counts the records the backfill has not read yet, so it goes
down during the batch. Read is not committed, so such a reading never counts as caught up: its
`total` is at least the version's catch-up threshold + 1 records and its `lag_seconds` at least
the pipeline's `catchup_seconds` + 1 (`pending_commit` is set; `unread` and `partitions` keep the
real figures). Such a total is a floor, and is shown as one (`fmt_lag`: "≥ 1,001 (first batch not
yet committed; 194 left to read)"). Once the batch commits, the checkpoint is the truth again.

Lag in time (`lag_seconds`): how old the oldest record the version has not processed yet is, from
the Kafka timestamps of the records at the next offsets (`orchestrator.observe.lagtime`). 0 when the
lag is 0; unknown (None) whenever the record lag is unknown or a record could not be fetched.

`measure_lag` only measures; `sample_lag` also stores the reading as a lag sample in the registry.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from pydantic import BaseModel, ConfigDict

from orchestrator.core import uris
from orchestrator.core.exceptions import BrokerError, BrokerUnreachable, KappaError
from orchestrator.core.times import to_seconds
from orchestrator.observe.lagtime import oldest_unread_age

if TYPE_CHECKING:
    from orchestrator.context import VersionRef

__all__ = ["KAFKA_TIMEOUT", "PartitionLag", "LagReading", "measure_lag", "sample_lag", "lag_from_offsets",
           "topic_partitions", "log_offsets", "group_offsets", "checkpoint_next_offsets", "eta_seconds",
           "sample_time", "sample_total", "sample_seconds", "partition_key", "format_partitions", "fmt_seconds",
           "LAG_SECONDS_TIMEOUT", "uncommitted_limits", "pending_floor", "fmt_lag"]

log = logging.getLogger(__name__)

#: Seconds a broker call may take before lag is declared unknown.
KAFKA_TIMEOUT = 10.0
#: Seconds the fetch of the oldest unprocessed records may take before lag in seconds is unknown.
LAG_SECONDS_TIMEOUT = 5.0


def partition_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def format_partitions(partitions: dict[str, int | None], limit: int = 8) -> str:
    """'member_profiles:0=120, member_profiles:3=7' (largest first), for error messages."""
    items = sorted(partitions.items(), key=lambda kv: (-(kv[1] if kv[1] is not None else 1 << 62), kv[0]))
    shown = ", ".join(f"{key}={'unknown' if v is None else v}" for key, v in items[:limit])
    if len(items) > limit:
        shown += f", ... ({len(items) - limit} more)"
    return shown


class PartitionLag(BaseModel):
    model_config = ConfigDict(frozen=True)

    topic: str
    partition: int
    log_start: int
    log_end: int
    next_offset: int
    lag: int                         # never negative
    source: str                      # checkpoint | group | log-start | reading
    past_end: int = 0                # how far the next offset is beyond the log end (see the module doc)
    group_offset: int | None = None  # the group's committed offset, for the cross-check


class LagReading(BaseModel):
    """One measurement of a version's lag. `total is None` means unknown."""

    model_config = ConfigDict(frozen=True)

    pipeline: str
    version: int
    at: float
    total: int | None
    partitions: dict[str, int | None]
    details: tuple[PartitionLag, ...] = ()
    source: str = "unknown"          # checkpoint | group | log-start | reading | unknown
    error: str | None = None
    batch_id: int | None = None      # last committed micro-batch behind the offsets
    sample_id: int | None = None     # the registry's id of the stored sample (`sample_lag`)
    lag_seconds: float | None = None  # age of the oldest unprocessed record; None: unknown
    pending_commit: bool = False     # read progress of an uncommitted backfill: never caught up
    unread: int | None = None        # with pending_commit: the records not read yet (`total` is floored)
    unreachable: bool = False        # unknown because the broker could not be reached (`BrokerUnreachable`)

    @property
    def floored(self) -> bool:
        """The total is a floor (`pending_floor`), above what the read progress says is left."""
        return self.pending_commit and self.unread is not None and self.total is not None and self.total > self.unread

    @property
    def known(self) -> bool:
        return self.total is not None

    def over(self, threshold: int) -> dict[str, int | None]:
        """Partitions whose lag is above `threshold` (all of them when unknown)."""
        if self.total is None:
            return dict(self.partitions) or {"*": None}
        return {p: lag for p, lag in self.partitions.items() if lag is not None and lag > threshold}


def kafka_error(what: str, k, e: Exception) -> BrokerError:
    refused = k.authentication_failure() if hasattr(k, "authentication_failure") else None
    if refused:
        conf = k.settings.kafka_config or {}
        listener = f"{conf.get('security.protocol', 'PLAINTEXT')} listener at {k.settings.bootstrap_servers}"
        return BrokerError(
            f"the Kafka broker's {listener} refused kappa's credentials "
            f"(sasl.mechanism={conf.get('sasl.mechanism', '?')}, sasl.username={str(conf.get('sasl.username', '?'))!r}): "
            f"fix sasl.username / sasl.password in the Kafka settings ([kafka_config] in kappa.toml, "
            f"KAPPA_KAFKA_CONFIG, or the Airflow Connection kafka_default)")
    return BrokerUnreachable(
        f"cannot read {what} from the Kafka broker at {k.settings.bootstrap_servers} ({e}); "
        f"check that the broker is up and that bootstrap_servers / kafka_config are right"
    )


def topic_partitions(k, topics: Iterable[str], timeout: float = KAFKA_TIMEOUT) -> dict[str, list[int]]:
    """Partition numbers of each topic; BrokerError if the broker or a topic is missing."""
    try:
        md = k.admin().list_topics(timeout=timeout)
    except KappaError:
        raise
    except Exception as e:
        raise kafka_error("topic metadata", k, e) from None
    out: dict[str, list[int]] = {}
    for topic in topics:
        tm = md.topics.get(topic)
        if tm is None or tm.error is not None:
            raise BrokerError(
                f"source topic {topic!r} does not exist on {k.settings.bootstrap_servers}"
                + (f" ({tm.error})" if tm is not None and tm.error is not None else "")
                + "; create it or fix the pipeline's topics"
            )
        out[topic] = sorted(tm.partitions)
    return out


def log_offsets(k, topics: Iterable[str], timeout: float = KAFKA_TIMEOUT) -> dict[tuple[str, int], tuple[int, int]]:
    """{(topic, partition): (log start, log end)} from the broker (ListOffsets earliest/latest)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    parts = topic_partitions(k, topics, timeout)
    tps = [(t, p) for t, ps in parts.items() for p in ps]
    if not tps:
        return {}
    admin = k.admin()
    try:
        latest = admin.list_offsets({TopicPartition(t, p): OffsetSpec.latest() for t, p in tps},
                                    request_timeout=timeout)
        earliest = admin.list_offsets({TopicPartition(t, p): OffsetSpec.earliest() for t, p in tps},
                                      request_timeout=timeout)
        ends = {(tp.topic, tp.partition): f.result().offset for tp, f in latest.items()}
        starts = {(tp.topic, tp.partition): f.result().offset for tp, f in earliest.items()}
    except Exception as e:
        raise kafka_error("log end offsets", k, e) from None
    return {tp: (starts[tp], ends[tp]) for tp in tps}


#: OffsetFetch answers that mean "ask again shortly": the group's coordinator moves or still loads.
_COORDINATOR_MOVING = {14, 15, 16}   # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR


def committed_offsets(config: dict, group_id: str, partitions: Iterable[tuple[str, int]],
                      timeout: float = KAFKA_TIMEOUT) -> dict[tuple[str, int], int]:
    """The committed offsets (next offset to read) of `group_id` for `partitions`; those without one
    are left out. A consumer of the group asks its coordinator (OffsetFetch) without joining it.

    Not `AdminClient.list_consumer_group_offsets`: librdkafka 2.x crashes the whole process (a
    segfault in rd_kafka_cgrp_op, confluentinc/librdkafka#5040) when the coordinator answers it
    NOT_COORDINATOR, as Apache Kafka does while it loads its groups after a start. A consumer's
    OffsetFetch retries that answer."""
    from confluent_kafka import Consumer, TopicPartition

    tps = [TopicPartition(t, p) for t, p in partitions]
    if not tps:
        return {}
    from confluent_kafka import KafkaException

    consumer = Consumer({**config, "group.id": group_id, "enable.auto.commit": False,
                         "enable.auto.offset.store": False}, logger=logging.getLogger("kappa.kafka"))
    deadline = time.monotonic() + timeout
    try:
        while True:   # a coordinator that moves or still loads its groups answers with a retriable error
            try:
                got = consumer.committed(tps, timeout=max(1.0, deadline - time.monotonic()))
                break
            except KafkaException as e:
                err = e.args[0] if e.args else None
                retry = err is not None and (err.retriable() or err.code() in _COORDINATOR_MOVING)
                if not retry or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): tp.offset for tp in got if tp.offset >= 0 and tp.error is None}


def group_offsets(k, group_id: str, topics: Iterable[str], timeout: float = KAFKA_TIMEOUT) -> dict[tuple[str, int], int]:
    """The consumer group's committed offsets on `topics` (next offset to read); {} for an unknown group."""
    parts = topic_partitions(k, topics, timeout)
    try:
        return committed_offsets(k.kafka_config(), group_id, [(t, p) for t, ps in parts.items() for p in ps], timeout)
    except Exception as e:
        raise kafka_error(f"the committed offsets of consumer group {group_id!r}", k, e) from None


def checkpoint_next_offsets(checkpoint: str | Path) -> tuple[dict[tuple[str, int], int] | None, int | None]:
    """Next offsets per partition from the last committed micro-batch of a Spark checkpoint.

    Returns (None, None) when the job has not committed a batch yet (or no checkpoint exists).
    `checkpoint` is a location (`orchestrator.core.uris`): a local one is read as a local path.
    """
    from jobs.lib.source.checkpoint import checkpoint_offsets, last_committed_batch

    if not uris.exists(checkpoint):
        return None, None
    local = uris.local_path(checkpoint)
    where = str(local) if local is not None else uris.normalize(checkpoint)
    offsets = checkpoint_offsets(where)
    if not offsets:
        return None, None
    out = {(topic, int(p)): int(o) for topic, parts in offsets.items() for p, o in parts.items()}
    return out, last_committed_batch(where)


def lag_from_offsets(pipeline: str, version: int, logs: dict[tuple[str, int], tuple[int, int]],
                     checkpoint: dict[tuple[str, int], int] | None,
                     group: dict[tuple[str, int], int] | None = None, *, at: float | None = None,
                     batch_id: int | None = None, reading: dict[tuple[str, int], Any] | None = None) -> LagReading:
    """The lag arithmetic: checkpoint offsets first, then the read progress of an uncommitted
    backfill (`reading`: `jobs.lib.source.read_progress.ReadPosition` per partition), then the group's
    offsets, then the log start. A reading from read progress is `pending_commit` (not floored here)."""
    group = group or {}
    reading = {} if checkpoint else (reading or {})
    if checkpoint:
        base, source = checkpoint, "checkpoint"
    elif group:
        base, source = group, "group"
    else:
        base, source = {}, "log-start"
    if reading:
        source = "reading"
    details = []
    for (topic, p), (start, end) in sorted(logs.items()):
        pos = reading.get((topic, p))
        if pos is not None:   # read, not committed: what the backfill has left, then what is past its end
            nxt = max(pos.next_offset, start)
            details.append(PartitionLag(topic=topic, partition=p, log_start=start, log_end=end, next_offset=nxt,
                                        lag=max(0, min(pos.unread, end - start) + max(0, end - pos.end)),
                                        past_end=max(0, nxt - end), source="reading",
                                        group_offset=group.get((topic, p))))
            continue
        if (topic, p) in base:
            nxt, psource = max(base[(topic, p)], start), "group" if reading else source
        else:  # not read yet (new partition, or nothing committed): the whole log is ahead
            nxt, psource = start, "log-start"
        details.append(PartitionLag(topic=topic, partition=p, log_start=start, log_end=end, next_offset=nxt,
                                    lag=max(0, end - nxt), past_end=max(0, nxt - end), source=psource,
                                    group_offset=group.get((topic, p))))
    partitions = {partition_key(d.topic, d.partition): None if d.past_end else d.lag for d in details}
    past = [d for d in details if d.past_end]
    error = None
    if past:
        where = ", ".join(f"{partition_key(d.topic, d.partition)} (next offset {d.next_offset}, log end {d.log_end})"
                          for d in past[:8]) + (f" and {len(past) - 8} more" if len(past) > 8 else "")
        error = (f"the {past[0].source} offsets of {pipeline} v{version} are past the log end on {where}: the "
                 f"topic was recreated or truncated after the job read it, so this version's table no longer "
                 f"matches the log; deploy a new version (`kappa deploy {pipeline}`), which reads it from offset zero")
    return LagReading(pipeline=pipeline, version=version, at=time.time() if at is None else at,
                      total=None if past else sum(partitions.values()), partitions=partitions,
                      details=tuple(details), source=source, error=error, batch_id=batch_id,
                      pending_commit=bool(reading))


def measure_lag(v: VersionRef, *, timeout: float = KAFKA_TIMEOUT) -> LagReading:
    """Measure the version's lag now; unknown (total None, error set) if it cannot be read."""
    k, spec, paths, pipeline, version = v.k, v.spec, v.paths, v.pipeline, v.version
    now = time.time()
    # The job's positions first, the log ends last: a running job only moves forward, so a batch it
    # commits in between makes the lag look larger for one sample, never its checkpoint "past the log
    # end" (which reads as a recreated topic and makes the lag unknown).
    try:
        ckpt, batch_id = checkpoint_next_offsets(paths.checkpoint)
    except Exception as e:  # a checkpoint being written or corrupt: fall back to the group
        log.warning("%s v%s: cannot read checkpoint %s (%s); using the consumer group's offsets",
                    pipeline, version, paths.checkpoint, e)
        ckpt, batch_id = None, None
    progress = {}
    if ckpt is None:   # nothing committed: a one-batch backfill may be reading
        try:
            from jobs.lib.source.read_progress import progress_positions, read_progress

            progress = progress_positions(read_progress(paths.checkpoint))
        except Exception as e:  # noqa: BLE001 - progress is a courtesy: lag from the offsets alone
            log.debug("%s v%s: no read progress (%s)", pipeline, version, e)
    try:
        group = group_offsets(k, paths.group_id, spec.topics, timeout)
    except KappaError as e:
        log.warning("%s v%s: %s", pipeline, version, e)
        group = {}
    try:
        logs = log_offsets(k, spec.topics, timeout)
    except KappaError as e:
        return LagReading(pipeline=pipeline, version=version, at=now, total=None, partitions={}, error=str(e),
                          unreachable=isinstance(e, BrokerUnreachable))
    reading = lag_from_offsets(pipeline, version, logs, ckpt, group, at=now, batch_id=batch_id, reading=progress)
    if reading.total is None:
        return reading
    age = 0.0 if reading.total == 0 else oldest_unread_age(k, reading.details, now=now,
                                                          timeout=min(timeout, LAG_SECONDS_TIMEOUT))
    reading = reading.model_copy(update={"lag_seconds": age})
    return pending_floor(v, reading) if reading.pending_commit else reading


def version_threshold(v: VersionRef) -> int:
    """The catch-up threshold of a version: its deploy's override, else the pipeline's."""
    override = (v.record.details or {}).get("threshold")
    return v.spec.catchup_threshold if override is None else int(override)


def uncommitted_limits(v: VersionRef) -> tuple[int, float | None]:
    """(records, seconds) a reading of an uncommitted backfill may never go under: one more than the
    version's catch-up threshold (the larger of the deploy's override and the pipeline's) and than
    the pipeline's `catchup_seconds`."""
    threshold = v.spec.catchup_threshold
    try:
        threshold = max(threshold, version_threshold(v))
    except (TypeError, ValueError) as e:
        log.debug("%s: threshold override unknown (%s)", v, e)
    return int(threshold) + 1, float(v.spec.catchup_seconds) + 1.0


def pending_floor(v: VersionRef, reading: LagReading) -> LagReading:
    """A reading from read progress with its total and seconds raised to `uncommitted_limits`, so
    that no catch-up rule takes it as caught up before the batch commits (see the module)."""
    records, seconds = uncommitted_limits(v)
    update: dict[str, Any] = {"total": max(reading.total, records), "unread": reading.total}
    if seconds is not None and reading.lag_seconds is not None:
        update["lag_seconds"] = max(reading.lag_seconds, seconds)
    return reading.model_copy(update=update)


#: A process deletes lag samples past the retention at most this often per registry (the delete
#: scans the table), and at its first sample.
PRUNE_EVERY_SECONDS = 600.0
_last_prune: dict[str, float] = {}


def sample_lag(v: VersionRef, *, timeout: float = KAFKA_TIMEOUT,
               batches: int | None = None) -> LagReading:
    """Measure the lag and store it as a lag sample in the registry (its id in `sample_id`), with
    `batches`, the micro-batches the version's job has committed since it started (None: unknown).

    Samples grow by one per poll of every version; those older than the setting
    `lag_sample_retention_seconds` are deleted here (see `PRUNE_EVERY_SECONDS`), for every
    version, stopped and retired ones included. A failed prune is logged, never raised.
    """
    k = v.k
    reading = measure_lag(v, timeout=timeout)
    rec = k.registry.add_lag_sample(v.pipeline, v.version, reading.total, dict(reading.partitions), at=reading.at,
                                    lag_seconds=reading.lag_seconds, batches=batches)
    reg_key = str(k.registry.url)
    if time.monotonic() - _last_prune.get(reg_key, -PRUNE_EVERY_SECONDS) >= PRUNE_EVERY_SECONDS:
        _last_prune[reg_key] = time.monotonic()
        try:
            k.registry.prune_lag_samples(reading.at - k.settings.lag_sample_retention_seconds)
        except KappaError as e:
            log.warning("cannot prune old lag samples: %s", e)
    return reading.model_copy(update={"sample_id": rec.id})


def sample_time(sample: Any) -> float:
    """Unix seconds of a lag sample record (datetime or number in `.at`)."""
    return float(to_seconds(sample["at"] if isinstance(sample, dict) else sample.at))


def sample_total(sample: Any) -> int | None:
    return sample["total"] if isinstance(sample, dict) else sample.total


def sample_seconds(sample: Any) -> float | None:
    """Lag in seconds of a lag sample (None: unknown, or taken before kappa measured it)."""
    return sample.get("lag_seconds") if isinstance(sample, dict) else getattr(sample, "lag_seconds", None)


def fmt_lag(total: int | None, *, floored: bool = False, unread: int | None = None) -> str:
    """A lag in records for people: 'unknown', '1,234', or a floor as a floor: '≥ 1,001 (first batch not
    yet committed; 194 left to read)' (`LagReading.floored`)."""
    if total is None:
        return "unknown"
    if floored:
        left = "" if unread is None else f"; {unread:,} left to read"
        return f"≥ {total:,} (first batch not yet committed{left})"
    return f"{total:,}"


def fmt_seconds(seconds: float | None) -> str:
    """'unknown', '0 s', '42 s', '7.5 min', '3.2 h': a lag in time for people."""
    if seconds is None:
        return "unknown"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def eta_seconds(samples: Iterable[Any], threshold: int = 0, *, since: float | None = None,
                window_seconds: float = 120.0) -> float | None:
    """Seconds until lag reaches `threshold` at the recent rate; 0 if there; None if unknown.

    The rate is the fall of total lag between the oldest and the newest known sample within
    `window_seconds` of the newest (and after `since`, the job's start). A lag that is not
    falling has no ETA.
    """
    pts = sorted((sample_time(s), sample_total(s)) for s in samples)
    if since is not None:
        pts = [p for p in pts if p[0] >= since]
    if not pts or pts[-1][1] is None:
        return None
    t_new, lag_new = pts[-1]
    if lag_new <= threshold:
        return 0.0
    known = [p for p in pts if p[1] is not None and p[0] >= t_new - window_seconds]
    if len(known) < 2:
        return None
    t_old, lag_old = known[0]
    if t_new <= t_old or lag_old <= lag_new:
        return None
    rate = (lag_old - lag_new) / (t_new - t_old)
    return (lag_new - threshold) / rate
