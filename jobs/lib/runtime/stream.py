"""Spark's Kafka source and the triggers, as kappa's runtime supplies them to every job.

A job reads ``spark.readStream.format("kafka")`` with the version's options (`kafka_options`):
``subscribe``, ``startingOffsets=earliest``, ``kafka.isolation.level=read_committed``,
``minPartitions`` (the cores, so a large batch is split into that many tasks at least; not for a
version with ``failOnDataLoss = false``, see `SPLIT_OPTIONS`),
``maxOffsetsPerTrigger`` (the live tail's cap), the consumer's poll and fetch sizes (`CONSUMER_SETTINGS`) and
the ``kafka.*`` client settings. Settings given
in librdkafka's names (kappa.toml's ``[kafka]``, the 0600 file of the version) are translated to the
Java client's: ``sasl.username``/``sasl.password`` become a ``sasl.jaas.config`` for the mechanism,
which Spark redacts from its plans, logs and UI (`jobs.lib.runtime.session.REDACTION` widens its patterns to it).

A broker that does not answer (stopped, restarting) is waited for ``brokerOutageSeconds`` (kappa's
own source option, default 120): the driver's offset requests and the executors' fetches get that
long in the Kafka client's settings; past it the query fails and the runtime reports one line,
``SourceError: broker unavailable: ...`` (`broker_unavailable`), which supervision restarts from the
checkpoint with its backoff.

Lost records: Spark's Kafka source reads with ``failOnDataLoss=false``, since it takes any gap in
the offsets for lost data and a compacted log is full of gaps. kappa checks instead, before each
batch is read, that no partition's log starts past the batch's start (`lost_offsets`): only
retention and DeleteRecords move a log start. The version's own ``failOnDataLoss`` (default true)
fails the job naming the partitions; false logs them and goes on.

Backfill in one pass (`start_stream`): a version whose checkpoint has no committed batch reads from
offset zero to the log end of the moment it starts in ONE micro-batch: ``Trigger.AvailableNow``
without ``maxOffsetsPerTrigger``, so no per-partition cap lets a sparse partition run ahead of a dense
one in event time. Then the same checkpoint goes on with the job's own trigger and the cap. A job
restarted mid-backfill replays batch 0 with the end offsets Spark logged for it.
"""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path
from typing import Any, Callable

from jobs.lib.runtime.stopping import GATE
from orchestrator.core.exceptions import ConfigError

__all__ = ["BACKFILL_MODES", "CONSUMER_SETTINGS", "SPARK_OPTIONS", "SPLIT_OPTIONS", "OUTAGE_OPTION", "check_source_options", "outage_seconds",
           "broker_unavailable", "fail_on_data_loss", "lost_offsets", "java_kafka_config", "kafka_options", "needs_backfill", "kafka_reader",
           "KafkaWarmUp", "start_stream", "ChainedQuery"]

log = logging.getLogger("kappa.runtime")

#: Options of Spark's Kafka source that kappa's options may set (names are case-insensitive there).
SPARK_OPTIONS = ("subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets", "failOnDataLoss",
                 "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "minPartitions",
                 "maxRecordsPerPartition", "includeHeaders", "kafkaConsumer.pollTimeoutMs",
                 "fetchOffset.numRetries", "fetchOffset.retryIntervalMs", "groupIdPrefix",
                 "startingOffsetsByTimestamp", "startingTimestamp", "startingOffsetsByTimestampStrategy")

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
#: Options that split one partition's offsets of a batch over several tasks. With lost records Spark's
#: source must skip (it always reads with failOnDataLoss=false, see the module), `KafkaDataConsumer.get`
#: returns its pooled consumer on the out-of-range offset and goes on polling it, while another task of
#: the same partition (same pool key) may borrow it: "KafkaConsumer is not safe for multi-threaded access"
#: (Spark 4.2, connector/kafka-0-10-sql .../consumer/KafkaDataConsumer.scala). A version that goes on
#: past lost records therefore reads each partition in one task: kappa adds no ``minPartitions`` to it,
#: and `check_source_options` refuses these with ``failOnDataLoss = false``.
SPLIT_OPTIONS = ("minpartitions", "maxrecordsperpartition")
#: librdkafka names that the Java client spells otherwise.
_RENAMED = {"sasl.mechanisms": "sasl.mechanism"}
#: Settings the source owns (Spark refuses them as options).
_OWNED = {"group.id", "auto.offset.reset", "enable.auto.commit", "key.deserializer", "value.deserializer",
          "interceptor.classes", "enable.partition.eof"}


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_kafka_config(config: dict[str, Any] | None) -> dict[str, str]:
    """kappa's Kafka client settings (librdkafka names) as the Java client's, without the prefix."""
    out: dict[str, str] = {}
    config = {str(k): str(v) for k, v in (config or {}).items()}
    username, password = config.pop("sasl.username", None), config.pop("sasl.password", None)
    for k, v in config.items():
        name = _RENAMED.get(k, k)
        if name not in _OWNED:
            out[name] = v
    if username is not None or password is not None:
        mechanism = out.get("sasl.mechanism", "PLAIN").upper()
        module = _LOGIN_MODULES.get(mechanism)
        if module is None:
            raise ConfigError(f"kafka setting sasl.mechanism {mechanism!r} with sasl.username/sasl.password: "
                              f"kappa knows {', '.join(_LOGIN_MODULES)}; give sasl.jaas.config yourself for others")
        out["sasl.mechanism"] = mechanism
        out["sasl.jaas.config"] = (f"{module} required username={_jaas_quote(username or '')} "
                                   f"password={_jaas_quote(password or '')};")
    return out


#: kappa's own source option: how long an unreachable broker is waited for before the query fails.
OUTAGE_OPTION = "brokerOutageSeconds"
DEFAULT_OUTAGE_SECONDS = 120
#: What the Kafka client says, in a failed query's error, when the broker did not answer in time.
_TIMED_OUT = re.compile(r"org\.apache\.kafka\.common\.errors\.TimeoutException|Timed out waiting for a node"
                        r"|Cannot fetch record .* milliseconds|Failed to get offsets|Timed out waiting to send the call")


def outage_seconds(overrides: dict | None) -> float:
    """The ``brokerOutageSeconds`` of a version's ``source_options`` (ConfigError if not a positive number)."""
    raw = {k.lower(): v for k, v in (overrides or {}).items()}.get(OUTAGE_OPTION.lower(), DEFAULT_OUTAGE_SECONDS)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not value > 0:
        raise ConfigError(f"source_options: {OUTAGE_OPTION} must be a number of seconds above 0, got {raw!r}")
    return value


def _outage_settings(seconds: float) -> dict[str, str]:
    """Spark's Kafka source waits out an unreachable broker for about `seconds`: the driver's offset
    requests (3 tries of a third each), the executors' fetches (one poll of the whole time)."""
    ms = int(seconds * 1000)
    per_try = max(3000, ms // 3)
    return {"fetchOffset.numRetries": "3", "fetchOffset.retryIntervalMs": "1000",
            "kafka.default.api.timeout.ms": str(per_try), "kafka.request.timeout.ms": str(min(per_try, 30000)),
            "kafkaConsumer.pollTimeoutMs": str(ms)}


def broker_unavailable(error: BaseException | str, bootstrap_servers: str, seconds: float) -> str | None:
    """The one-line SourceError of a query that failed because the broker did not answer for the
    outage time (what supervision restarts as ``broker_unavailable``), or None for another failure."""
    if not _TIMED_OUT.search(str(error)):
        return None
    return (f"SourceError: broker unavailable: the Kafka broker at {bootstrap_servers} did not answer Spark's Kafka "
            f"source for {seconds:g} s ({OUTAGE_OPTION}={seconds:g}); start it, or raise {OUTAGE_OPTION} in the "
            f"pipeline's source_options")


def fail_on_data_loss(overrides: dict | None) -> bool:
    """The version's ``failOnDataLoss`` (default true). kappa checks it itself (`lost_offsets`): Spark's
    Kafka source gets ``false``, because it would take every compaction gap for lost data."""
    raw = {k.lower(): v for k, v in (overrides or {}).items()}.get("failondataloss", "true")
    if str(raw).lower() not in ("true", "false"):
        raise ConfigError(f"source_options: failOnDataLoss must be true or false, got {raw!r}")
    return str(raw).lower() == "true"


def lost_offsets(start: dict[str, dict[str, int]], bootstrap_servers: str,
                 kafka_config: dict | None = None, timeout: float = 30.0) -> list[str]:
    """Partitions whose log now starts past where this batch starts (retention or DeleteRecords
    removed records the version never read), as ``topic[p] next offset S < log start L``; compaction
    never moves a log start, so its gaps are not listed."""
    from confluent_kafka import Consumer, TopicPartition

    conf = {"bootstrap.servers": bootstrap_servers, "group.id": "kappa-log-start", "enable.auto.commit": False,
            **{str(k): v for k, v in (kafka_config or {}).items()}}
    consumer = Consumer(conf)
    try:
        lost = []
        for topic, parts in sorted(start.items()):
            for p, offset in sorted(parts.items(), key=lambda kv: int(kv[0])):
                low, _high = consumer.get_watermark_offsets(TopicPartition(topic, int(p)), timeout=timeout)
                if 0 <= offset < low:
                    lost.append(f"{topic}[{p}] next offset {offset} < log start {low} ({low - offset} offsets deleted "
                                f"before the version read them)")
        return lost
    finally:
        consumer.close()


#: The Kafka consumer's settings kappa gives Spark's source; a pipeline's ``source_options`` override
#: them. After every poll Spark's source asks the partition's log start and end (`InternalKafkaConsumer.fetch`:
#: two ListOffsets round trips); at the client's default of 500 records a poll, a 2M-record backfill made
#: 8,000 of them, 6% of its tasks' CPU (JFR samples: 127 of 2,055 in `getAvailableOffsetRange`, 13 of 2,103 at
#: 20,000 a poll). A poll of up to 10,000 records needs fetches of up to 4 MiB a partition (the client's
#: default is 1 MiB) and a socket buffer to match (64 KiB by default).
CONSUMER_SETTINGS = {"max.poll.records": "10000", "max.partition.fetch.bytes": str(4 << 20),
                     "receive.buffer.bytes": str(1 << 20)}


def kafka_options(bootstrap_servers: str, topics: str, *, kafka_config: dict | None = None,
                  max_offsets_per_trigger: int | None = None, min_partitions: int | None = None,
                  overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The options of Spark's Kafka source for one version (see the module); `overrides` (the
    pipeline's ``source_options``) last."""
    overrides = overrides or {}
    check_source_options(overrides)
    stops_on_loss = fail_on_data_loss(overrides)
    opts = {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": topics, "startingOffsets": "earliest",
            "kafka.isolation.level": "read_committed", "failOnDataLoss": "false",
            **_outage_settings(outage_seconds(overrides))}
    if max_offsets_per_trigger:
        opts["maxOffsetsPerTrigger"] = str(int(max_offsets_per_trigger))
    if min_partitions and stops_on_loss:   # see `SPLIT_OPTIONS`
        opts["minPartitions"] = str(int(min_partitions))
    for k, v in {**CONSUMER_SETTINGS, **java_kafka_config(kafka_config)}.items():
        opts[f"kafka.{k}"] = v
    lower = {k.lower(): k for k in opts}
    for k, v in overrides.items():
        if k.lower() in (OUTAGE_OPTION.lower(), "failondataloss"):   # kappa's own, see above
            continue
        opts.pop(lower.get(k.lower(), k), None)
        opts[k] = str(v)
    return opts


def check_source_options(options: dict) -> None:
    """ConfigError, one line, for a ``source_options`` name that Spark's Kafka source does not take, a bad
    ``brokerOutageSeconds``, or a `SPLIT_OPTIONS` option with ``failOnDataLoss = false``."""
    known = {o.lower() for o in SPARK_OPTIONS} | {OUTAGE_OPTION.lower()}
    for k in options:
        if not (str(k).lower().startswith("kafka.") or str(k).lower() in known):
            raise ConfigError(f"source_options: unknown option {k!r} of Spark's Kafka source; known: "
                              f"{', '.join(SPARK_OPTIONS)}, {OUTAGE_OPTION} (kappa's) and kafka.* client settings")
    outage_seconds(options)
    split = sorted(k for k in options if str(k).lower() in SPLIT_OPTIONS)
    if split and not fail_on_data_loss(options):
        raise ConfigError(f"source_options: {', '.join(map(str, split))} with failOnDataLoss = false: Spark's Kafka "
                          f"source splits a partition's offsets over several tasks, and when records are lost it "
                          f"reuses a consumer it gave back, which another of those tasks may hold (the batch then "
                          f"fails with ConcurrentModificationException); drop {', '.join(map(str, split))}, or "
                          f"keep failOnDataLoss = true")


def needs_backfill(checkpoint: str | Path) -> bool:
    """True while the checkpoint has no committed micro-batch: the version's first pass is to come."""
    commits = Path(checkpoint) / "commits"
    return not commits.is_dir() or not any(p.name.isdigit() for p in commits.iterdir())


def kafka_reader(spark: Any, options: dict[str, str]) -> Callable[..., Any]:
    """`read(topics=None)`: a Kafka stream with `options`, over `topics` instead of ``subscribe``."""
    def read(topics: str | list[str] | None = None) -> Any:
        opts = dict(options)
        if topics is not None:
            opts["subscribe"] = topics if isinstance(topics, str) else ",".join(topics)
        reader = spark.readStream.format("kafka")
        for k, v in opts.items():
            reader = reader.option(k, v)
        return reader.load()
    return read


class KafkaWarmUp(threading.Thread):
    """What Spark's Kafka source does first in a fresh JVM, done beforehand on the other core: an admin
    client with the source's ``kafka.*`` settings asks the end offsets of its ``subscribe`` topics.

    The query's first trigger asks the same (its ``latestOffset``), and in a fresh JVM the Kafka client's
    first request costs about 0.8 s of class loading and compiling, while a second client's costs a tenth
    of that. `jobs.lib.contract.runner.start_job` starts this before it calls the job's function on the
    stream (a second or more of the driver analysing the job's plan, one thread), so that the query's
    first batch finds the client warm. A courtesy: `offsets` holds what it read, `error` why it read
    nothing (one line, logged at debug); a broker that does not answer is the query's to report.
    """

    def __init__(self, spark: Any, options: dict[str, str], timeout: float = 10.0):
        super().__init__(name="kappa-kafka-warm-up", daemon=True)
        self.jvm, self.options, self.timeout = spark._jvm, dict(options), timeout
        self.offsets: dict[tuple[str, int], int] | None = None
        self.error: str | None = None

    def run(self) -> None:
        try:
            self.offsets = self._end_offsets()
        except Exception as e:  # noqa: BLE001 - the query reports what matters
            from jobs.lib.runtime.status import summarize_error

            java = getattr(e, "java_exception", None)
            self.error = str(java.toString()) if java is not None else summarize_error(e)
            for k, v in self.options.items():   # a client's error does not quote them; in case one does
                if any(w in k.lower() for w in ("password", "jaas", "secret")) and str(v):
                    self.error = self.error.replace(str(v), "***")
            log.debug("the Kafka client was not warmed up: %s", self.error)

    def _end_offsets(self) -> dict[tuple[str, int], int]:
        jvm, admin_pkg = self.jvm, self.jvm.org.apache.kafka.clients.admin
        seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
        known = admin_pkg.AdminClientConfig.configNames()
        props = jvm.java.util.Properties()
        for k, v in self.options.items():
            if k.lower().startswith("kafka.") and known.contains(k[len("kafka."):]):
                props.setProperty(k[len("kafka."):], str(v))
        topics = [t.strip() for t in self.options.get("subscribe", "").split(",") if t.strip()]
        admin = admin_pkg.Admin.create(props)
        try:
            names = jvm.java.util.ArrayList()
            for t in topics:
                names.add(t)
            described = admin.describeTopics(names).allTopicNames().get(int(self.timeout), seconds)
            wanted = jvm.java.util.HashMap()
            for t in topics:
                for info in described.get(t).partitions():
                    wanted.put(jvm.org.apache.kafka.common.TopicPartition(t, info.partition()),
                               admin_pkg.OffsetSpec.latest())
            got = admin.listOffsets(wanted).all().get(int(self.timeout), seconds)
            return {(tp.topic(), int(tp.partition())): int(got.get(tp).offset()) for tp in got.keySet().toArray()}
        finally:
            admin.close(jvm.java.time.Duration.ofSeconds(1))


def _start(spark: Any, options: dict[str, str], build: Callable[..., Any], sink: Callable[[Any, int], None],
           checkpoint: str, trigger: dict, name: str, output_mode: str) -> Any:
    """The query, its foreachBatch function behind the stop gate (`jobs.lib.runtime.stopping`)."""
    return (build(kafka_reader(spark, options)).writeStream.queryName(name).outputMode(output_mode)
            .foreachBatch(GATE.wrap(sink)).option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())


BACKFILL_MODES = ("one-batch", "capped")


def start_stream(spark: Any, options: dict[str, str], sink: Callable[[Any, int], None], *, checkpoint: str,
                 trigger: dict, name: str, build: Callable[..., Any] = lambda read: read(),
                 backfill: str = "one-batch", output_mode: str = "append") -> Any:
    """Start the version's query (see the module for the backfill); returns a StreamingQuery, or a
    `ChainedQuery` of the backfill and the live query that behaves as one.

    `build(read)` makes the query's DataFrame: ``read()`` is the Kafka stream over the version's topics,
    ``read(topics)`` one over some of them (a join of two streams). ``backfill="capped"``: the first
    pass is capped by ``maxOffsetsPerTrigger`` too (several batches; for a log too large to read in
    one, at the price of event-time skew between partitions)."""
    if backfill not in BACKFILL_MODES:
        raise ConfigError(f"backfill must be one of {', '.join(BACKFILL_MODES)}, got {backfill!r}")
    if backfill == "capped" or not needs_backfill(checkpoint):
        return _start(spark, options, build, sink, checkpoint, trigger, name, output_mode)
    uncapped = {k: v for k, v in options.items() if k.lower() != "maxoffsetspertrigger"}
    first = _start(spark, uncapped, build, sink, checkpoint, {"availableNow": True}, name, output_mode)
    if trigger.get("availableNow"):
        return first
    return ChainedQuery(first, lambda: _start(spark, options, build, sink, checkpoint, trigger, name, output_mode))


class ChainedQuery:
    """The backfill query, then the live one on the same checkpoint, seen as one StreamingQuery."""

    def __init__(self, first: Any, then: Callable[[], Any]):
        self._lock = threading.Lock()
        self._current = first
        self._then: Callable[[], Any] | None = then
        self._stopped = False
        self._start_error: BaseException | None = None

    def _advance(self) -> Any:
        """The query running now: the live one once the backfill query has ended without an error.

        Spark marks an available-now query inactive as soon as its last batch is done, but unregisters it
        from the session only after closing its Kafka clients (about a second), and refuses a query of
        the same name until then: the live query starts after `awaitTermination()` without a timeout,
        which returns only once the backfill's run is gone. A live query that cannot start is the chain's
        error (`exception()`), never a clean stop."""
        with self._lock:
            q = self._current
            if self._then is not None and not self._stopped and not q.isActive and q.exception() is None:
                q.awaitTermination()
                log.info("backfill committed: the query goes on with the live trigger")
                then, self._then = self._then, None
                try:
                    self._current = then()
                except Exception as e:
                    self._start_error = e
                    raise
            return self._current

    @property
    def id(self) -> Any:
        return self._current.id

    @property
    def runId(self) -> Any:
        return self._current.runId

    @property
    def name(self) -> Any:
        return self._current.name

    @property
    def isActive(self) -> bool:
        return self._advance().isActive

    @property
    def status(self) -> Any:
        return self._current.status

    @property
    def recentProgress(self) -> Any:
        return self._current.recentProgress

    @property
    def lastProgress(self) -> Any:
        return self._current.lastProgress

    def awaitTermination(self, timeout: float | None = None) -> Any:
        q = self._advance()
        out = q.awaitTermination(timeout) if timeout is not None else q.awaitTermination()
        if not q.isActive and self._then is not None:
            q = self._advance()
            if timeout is None:
                return q.awaitTermination()
            return q is not None and not q.isActive
        return out

    def exception(self) -> Any:
        return self._start_error if self._start_error is not None else self._current.exception()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            q = self._current
        q.stop()

    def processAllAvailable(self) -> None:
        self._advance().processAllAvailable()
