"""Kafka as a Spark streaming source, on Spark's Python Data Source API and confluent-kafka.

    spark.readStream.format("kappa_kafka")
        .option("bootstrap.servers", "127.0.0.1:9092")
        .option("topics", "member_profiles")
        .option("group.id", "kappa.standardize.v3")     # optional: lag visible to Kafka tools
        .load()

Why a Python source: Spark's own Kafka connector is a JAR that cannot be fetched on these
machines; this one runs on any Spark 4.2 from PyPI.

Rows: ``key`` binary, ``value`` binary (null: tombstone), ``topic``, ``partition``, ``offset``,
``timestamp``, ``headers`` array<struct<key, value>> (null when the record carries none, as in
Spark's own Kafka source). ``read`` yields pyarrow RecordBatches built column by column from
``consume()`` chunks, with the garbage collector paused: building Python objects per record is
where a Python Kafka reader spends its time.

Offsets are Spark's offset JSON, a plain dict ``{"topic": {"0": 120, "1": 98}}`` giving the NEXT
offset to read per partition; they live in ``<checkpoint>/offsets/<batch_id>``, which is the truth
about what a query has processed (the consumer-group commits are a courtesy for lag tools).

Where each part runs:

* ``KafkaDataSource`` and ``KafkaStreamReader.__init__`` run on the driver, in the planner process
  and in the long-lived Python process that serves the streaming engine; the reader is pickled to
  the executors, so it holds settings only and opens Kafka clients lazily.
* ``initialOffset``, ``latestOffset``, ``prepareForTriggerAvailableNow``, ``partitions``,
  ``commit``, ``reportLatestOffset`` and ``stop`` run on the driver, in that one process, so the
  admin client and the available-now target survive between calls.
* ``read`` runs on an executor, once per ``KafkaRange``, with a consumer of its own.

Correctness rules that hold for compacted and transactional topics:

* A range ``[start, end)`` is finished when the consumer's position reaches ``end`` (or a record at
  or beyond ``end`` arrives, or end-of-partition is reported at or beyond ``end``), never by counting
  records: compaction leaves offset gaps and transaction markers take offsets of their own.
* Records at or beyond ``end`` are never emitted (tansu under-reports watermarks, and a fetch may
  return more than was asked).
* A range never blocks forever: without progress the reader re-reads the watermarks and either
  finishes, or raises ``SourceError`` after ``read.timeout.seconds``.
* Offsets the broker no longer has (log start moved past a checkpointed offset, or the log ends
  before it): ``SourceError`` by default; with ``on.missing.offsets=earliest`` the source continues
  from the earliest available offset and logs how many offsets it skipped. Partitions that appear
  while the query runs start at offset 0 (their earliest offset, if the log start moved already).

Options (besides the contract's): ``min.partitions`` (default 2: a micro-batch is split into at
least this many Spark tasks when it is large enough), ``split.min.records`` (10000: no task gets
a smaller slice of a partition), ``read.timeout.seconds`` (60), ``arrow.batch.rows`` (50000),
``starting.offsets`` also takes ``earliest`` or ``latest``, and -2/-1 per partition.
"""

from __future__ import annotations

import bisect
import gc
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from orchestrator.core.exceptions import SourceError

log = logging.getLogger("kappa.source")

NAME = "kappa_kafka"
DEFAULT_MAX_RECORDS = 100_000
MISSING_POLICIES = ("fail", "earliest")
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")

SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType()),
        StructField("value", BinaryType()),
    ]))),
])

#: (topic, partition)
TP = tuple[str, int]


# --------------------------------------------------------------------------------------------
# Offsets: Spark's offset JSON <-> {(topic, partition): offset}. Pure functions, unit-tested.
# --------------------------------------------------------------------------------------------

def offsets_to_map(offsets: Mapping[str, Mapping[str, int]] | None) -> dict[TP, int]:
    """``{"t": {"0": 5}}`` -> ``{("t", 0): 5}``; validates the shape so a bad option fails clearly."""
    out: dict[TP, int] = {}
    if not offsets:
        return out
    if not isinstance(offsets, Mapping):
        raise SourceError(f"offsets must be a JSON object {{\"topic\": {{\"0\": 5}}}}, got {offsets!r}")
    for topic, parts in offsets.items():
        if not isinstance(parts, Mapping):
            raise SourceError(
                f"offsets of topic {topic!r} must be an object of partition -> offset, got {parts!r}")
        for p, o in parts.items():
            try:
                out[(str(topic), int(p))] = int(o)
            except (TypeError, ValueError):
                raise SourceError(
                    f"offset of topic {topic!r} partition {p!r} must be an integer, got {o!r}") from None
    return out


def map_to_offsets(m: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """Inverse of `offsets_to_map`, in canonical order (topics sorted, partitions numerically).

    Canonical order matters: Spark decides that a source has no new data when the JSON it returns
    equals the start JSON.
    """
    out: dict[str, dict[str, int]] = {}
    for (t, p) in sorted(m):
        out.setdefault(t, {})[str(p)] = int(m[(t, p)])
    return out


def split_cap(available: Mapping[TP, int], cap: int) -> dict[TP, int]:
    """Share a row cap across partitions: equal shares, what one cannot use goes to the others.

    Deterministic. The sum is ``min(cap, sum(available))``; a remainder smaller than the number of
    partitions goes one each to the partitions with the most left (ties: topic, partition order).
    """
    alloc = {tp: 0 for tp in available}
    remaining = max(0, int(cap))
    active = sorted(tp for tp, n in available.items() if n > 0)
    while remaining > 0 and active:
        share = remaining // len(active)
        if share == 0:
            by_most_left = sorted(active, key=lambda tp: (-(available[tp] - alloc[tp]), tp))
            for tp in by_most_left[:remaining]:
                alloc[tp] += 1
            break
        for tp in active:
            give = min(share, available[tp] - alloc[tp])
            alloc[tp] += give
            remaining -= give
        active = [tp for tp in active if alloc[tp] < available[tp]]
    return alloc


@dataclass(frozen=True)
class Watermarks:
    """Log start and end of one partition; ``high`` is the last stable offset under read_committed."""

    low: int
    high: int


@dataclass
class Plan:
    """What `plan_end_offsets` decided: end offsets, and the offsets it chose to skip."""

    end: dict[TP, int]
    skipped: dict[TP, tuple[int, int]] = field(default_factory=dict)  # tp -> (from, to)
    new_partitions: list[TP] = field(default_factory=list)


def plan_end_offsets(start: Mapping[TP, int], watermarks: Mapping[TP, Watermarks], *,
                     max_rows: int | None, target: Mapping[TP, int] | None = None,
                     on_missing: str = "fail") -> Plan:
    """End offsets of the next micro-batch. Runs on the driver; pure.

    * Every partition of ``start`` stays in the result (a vanished topic keeps its offsets).
    * Partitions not in ``start`` are new: they start at 0 (or their log start if it moved).
    * ``target`` (available-now) caps every partition; partitions absent from it get no data.
    * ``max_rows`` caps the sum of offset deltas (an upper bound of records: gaps only shrink it).
    * A start below the log start or beyond the log end is data the broker no longer has:
      ``SourceError`` under ``on_missing="fail"``; under ``"earliest"`` the batch continues from the
      log start and the skipped offsets are reported in ``Plan.skipped``.
    """
    missing: list[str] = []
    eff_start: dict[TP, int] = {}
    limit_to: dict[TP, int] = {}
    plan = Plan(end={})
    for tp in sorted(set(start) | set(watermarks)):
        wm = watermarks.get(tp)
        is_new = tp not in start
        s = start.get(tp, 0)
        if wm is None:
            plan.end[tp] = s
            continue
        if is_new:
            plan.new_partitions.append(tp)
        if s < wm.low or s > wm.high:
            if not is_new and on_missing != "earliest":
                if s < wm.low:
                    missing.append(f"{tp[0]}[{tp[1]}] next offset {s} < log start {wm.low} "
                                   f"({wm.low - s} offsets deleted by retention or compaction)")
                else:
                    missing.append(f"{tp[0]}[{tp[1]}] next offset {s} > log end {wm.high} "
                                   f"(the topic was recreated or the log truncated)")
                continue
            if not is_new:
                plan.skipped[tp] = (s, wm.low)
            s = wm.low
        eff_start[tp] = s
        high = wm.high
        if target is not None:
            high = min(high, target.get(tp, s))
        limit_to[tp] = max(s, high)
    if missing:
        raise SourceError(
            "the broker no longer has offsets this query must read: " + "; ".join(missing)
            + ". Reprocess from a new checkpoint, or set the source option on.missing.offsets=earliest "
              "to continue from the earliest available offsets (skipped offsets are logged)."
        )
    available = {tp: limit_to[tp] - eff_start[tp] for tp in eff_start}
    alloc = available if max_rows is None else split_cap(available, max_rows)
    for tp, s in eff_start.items():
        plan.end[tp] = s + alloc[tp]
    return plan


@dataclass(frozen=True)
class RangeSpec:
    topic: str
    partition: int
    start: int
    end: int
    new: bool = False


def plan_ranges(start: Mapping[TP, int], end: Mapping[TP, int], *, min_partitions: int = 2,
                split_min_records: int = 10_000) -> list[RangeSpec]:
    """Per-partition offset ranges of one micro-batch, large ones split so every core has work.

    Deterministic in (start, end): Spark calls it again with the logged offsets after a restart.
    A partition missing from ``start`` is new and reads from 0. ``end < start`` only comes from a
    rewind under ``on.missing.offsets=earliest`` (log end moved below the checkpoint): the range is
    then read from 0, which the reader moves up to the log start.
    """
    whole: list[RangeSpec] = []
    for tp in sorted(end):
        e = end[tp]
        new = tp not in start
        s = start.get(tp, 0)
        if e < s:
            s, new = 0, True
        if e > s:
            whole.append(RangeSpec(tp[0], tp[1], s, e, new))
    total = sum(r.end - r.start for r in whole)
    if not total:
        return []
    piece = max(int(split_min_records), math.ceil(total / max(1, int(min_partitions))), 1)
    out: list[RangeSpec] = []
    for r in whole:
        n = math.ceil((r.end - r.start) / piece)
        size = math.ceil((r.end - r.start) / n)
        for a in range(r.start, r.end, size):
            out.append(RangeSpec(r.topic, r.partition, a, min(a + size, r.end), r.new and a == r.start))
    return out


# --------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------

def _int_option(options: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        v = int(str(raw).strip())
    except ValueError:
        raise SourceError(f"source option {name} must be an integer, got {raw!r}") from None
    if v < minimum:
        raise SourceError(f"source option {name} must be at least {minimum}, got {v}")
    return v


@dataclass(frozen=True)
class SourceSettings:
    """The source options, parsed and validated once on the driver; picklable."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    group_id: str | None = None
    max_records_per_batch: int = DEFAULT_MAX_RECORDS
    starting_offsets: str = "earliest"  # "earliest" | "latest" | offset JSON
    on_missing_offsets: str = "fail"
    isolation_level: str = "read_committed"
    kafka: tuple[tuple[str, str], ...] = ()
    min_partitions: int = 2
    split_min_records: int = 10_000
    read_timeout_seconds: float = 60.0
    arrow_batch_rows: int = 50_000

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "SourceSettings":
        opts = {str(k).lower(): v for k, v in dict(options).items()}
        bootstrap = (opts.get("bootstrap.servers") or opts.get("kafka.bootstrap.servers") or "").strip()
        if not bootstrap:
            raise SourceError("source option bootstrap.servers is required, e.g. "
                              ".option('bootstrap.servers', '127.0.0.1:9092')")
        topics = tuple(t.strip() for t in str(opts.get("topics") or "").split(",") if t.strip())
        if not topics:
            raise SourceError("source option topics is required: a comma-separated list of topic names")
        missing = str(opts.get("on.missing.offsets") or "fail").strip().lower()
        if missing not in MISSING_POLICIES:
            raise SourceError(f"source option on.missing.offsets must be one of {', '.join(MISSING_POLICIES)}, "
                              f"got {missing!r}")
        iso = str(opts.get("isolation.level") or opts.get("kafka.isolation.level") or "read_committed").strip().lower()
        if iso not in ISOLATION_LEVELS:
            raise SourceError(f"source option isolation.level must be one of {', '.join(ISOLATION_LEVELS)}, got {iso!r}")
        starting = str(opts.get("starting.offsets") or "earliest").strip()
        if starting.lower() in ("earliest", "latest"):
            starting = starting.lower()
        else:
            try:
                parsed = json.loads(starting)
            except json.JSONDecodeError as e:
                raise SourceError(f"source option starting.offsets must be earliest, latest or offset JSON "
                                  f"like {{\"topic\": {{\"0\": 5}}}}: {e}") from None
            offsets_to_map(parsed)
            unknown = sorted(set(parsed) - set(topics))
            if unknown:
                raise SourceError(f"source option starting.offsets names topics not in topics: {unknown}")
            starting = json.dumps(parsed, sort_keys=True)
        timeout = opts.get("read.timeout.seconds")
        try:
            read_timeout = float(timeout) if timeout not in (None, "") else 60.0
        except ValueError:
            raise SourceError(f"source option read.timeout.seconds must be a number, got {timeout!r}") from None
        kafka = tuple(sorted((k[len("kafka."):], str(v)) for k, v in opts.items()
                             if k.startswith("kafka.") and k not in ("kafka.bootstrap.servers", "kafka.isolation.level")))
        group = (opts.get("group.id") or opts.get("kafka.group.id") or "").strip() or None
        return cls(
            bootstrap_servers=bootstrap,
            topics=topics,
            group_id=group,
            max_records_per_batch=_int_option(opts, "max.records.per.batch", DEFAULT_MAX_RECORDS, 1),
            starting_offsets=starting,
            on_missing_offsets=missing,
            isolation_level=iso,
            kafka=tuple((k, v) for k, v in kafka if k != "group.id"),
            min_partitions=_int_option(opts, "min.partitions", 2, 1),
            split_min_records=_int_option(opts, "split.min.records", 10_000, 1),
            read_timeout_seconds=read_timeout,
            arrow_batch_rows=_int_option(opts, "arrow.batch.rows", 50_000, 1),
        )

    def client_config(self) -> dict:
        """Settings every client gets: bootstrap servers and the `kafka.*` passthrough (SASL/SSL...)."""
        return {"bootstrap.servers": self.bootstrap_servers, **dict(self.kafka)}

    def consumer_config(self, group_id: str | None = None) -> dict:
        conf = {
            "client.id": "kappa-source",
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "queued.min.messages": 200_000,
            "fetch.wait.max.ms": 100,
            "log_level": 3,
            **self.client_config(),
            # correctness: never let the client decide offsets or commit on its own
            "group.id": group_id or self.group_id or "kappa-source",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "isolation.level": self.isolation_level,
        }
        return conf

    def admin_config(self) -> dict:
        return {"client.id": "kappa-source-admin", "log_level": 3, **self.client_config()}


# --------------------------------------------------------------------------------------------
# Driver side: metadata and watermarks
# --------------------------------------------------------------------------------------------

class _Broker:
    """Driver-side Kafka access (metadata, watermarks, group commits). Not picklable; created lazily."""

    def __init__(self, settings: SourceSettings):
        from confluent_kafka.admin import AdminClient

        self.settings = settings
        self.admin = AdminClient(settings.admin_config())
        self._committer = None
        self.commit_failed = False  # set by the commit callback; the next commit then retries

    def _retry(self, what: str, fn, attempts: int = 3):
        last: Exception | None = None
        for i in range(attempts):
            try:
                return fn()
            except SourceError:
                raise
            except Exception as e:  # KafkaException, timeouts
                last = e
                time.sleep(0.5 * (i + 1))
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
                tp, e = next(iter(sorted(bad.items())))
                raise RuntimeError(f"{tp[0]}[{tp[1]}]: {e}")
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
    b = _Broker(settings)
    try:
        b.commit_group(group_id, offsets_to_map(offsets), wait=True)
    finally:
        b.close()


# --------------------------------------------------------------------------------------------
# The data source and its stream reader
# --------------------------------------------------------------------------------------------

class KafkaRange(InputPartition):
    """One Spark task: offsets ``[start, end)`` of one topic partition. Picklable, immutable."""

    def __init__(self, topic: str, partition: int, start: int, end: int, new: bool = False):
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.new = new

    def __repr__(self) -> str:
        return f"KafkaRange({self.topic}[{self.partition}] {self.start}..{self.end}{' new' if self.new else ''})"


class KafkaDataSource(DataSource):
    """``format("kappa_kafka")``: a streaming source over one or more Kafka topics."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> "KafkaStreamReader":
        """Runs on the driver; validates the options so a mistake fails before the query starts."""
        return KafkaStreamReader(SourceSettings.from_options(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver and reads offset ranges on executors.

    Picklable: only ``settings`` travels; Kafka clients and the available-now target live in the
    driver's long-lived Python process and are dropped on pickling.
    """

    def __init__(self, settings: SourceSettings):
        self.settings = settings
        self._broker: _Broker | None = None
        self._target: dict[TP, int] | None = None
        self._latest: dict[TP, int] | None = None
        self._group_committed: dict[TP, int] | None = None

    def __getstate__(self) -> dict:
        return {"settings": self.settings, "_broker": None, "_target": None, "_latest": None,
                "_group_committed": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    @property
    def broker(self) -> _Broker:
        if self._broker is None:
            self._broker = _Broker(self.settings)
        return self._broker

    # --- driver ---------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        """Driver. Earliest (or the given starting offsets) for every partition of every topic."""
        tps = self.broker.partitions(required=True)
        wms = self.broker.watermarks(tps)
        mode = self.settings.starting_offsets
        given = {} if mode in ("earliest", "latest") else offsets_to_map(json.loads(mode))
        start: dict[TP, int] = {}
        for tp in tps:
            o = given.get(tp, -1 if mode == "latest" else -2)
            start[tp] = wms[tp].low if o == -2 else wms[tp].high if o == -1 else o
        unknown = sorted(set(given) - set(tps))
        if unknown:
            raise SourceError(f"starting.offsets names partitions that do not exist: {unknown}; "
                              f"existing partitions: {tps}")
        log.info("initial offsets %s", map_to_offsets(start))
        return map_to_offsets(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        """Driver. At most ``max.records.per.batch`` records (offsets) per micro-batch."""
        return ReadMaxRows(self.settings.max_records_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """Driver, once at the start of an available-now query: fix the end offsets to reach."""
        tps = self.broker.partitions(required=True)
        wms = self.broker.watermarks(tps)
        self._target = {tp: w.high for tp, w in wms.items()}
        log.info("available-now target offsets %s", map_to_offsets(self._target))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Driver. End offsets of the next micro-batch: up to the latest offsets (or the
        available-now target), capped by ``limit``; new partitions are included from offset 0."""
        start_map = offsets_to_map(start)
        # Spark only asks for the next batch once the previous one is committed, so ``start`` is
        # processed: committing it here keeps the group current while the query idles and after
        # the last available-now batch (Spark calls commit() only when it plans the next batch).
        self._commit_group(start_map)
        tps = self.broker.partitions(required=False)
        wms = self.broker.watermarks(tps, tolerate=True)
        self._latest = {tp: w.high for tp, w in wms.items()}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if not isinstance(limit, (ReadMaxRows, ReadAllAvailable)):
            log.warning("read limit %r is not supported; reading all available", limit)
        plan = plan_end_offsets(start_map, wms, max_rows=max_rows, target=self._target,
                                on_missing=self.settings.on_missing_offsets)
        for (t, p), (a, b) in plan.skipped.items():
            if b > a:
                log.warning("on.missing.offsets=earliest: %s[%d] skips offsets %d..%d (%d offsets the "
                            "broker no longer has)", t, p, a, b - 1, b - a)
            else:
                log.warning("on.missing.offsets=earliest: %s[%d] checkpointed offset %d is beyond the "
                            "log end; continuing from the log start %d", t, p, a, b)
        for t, p in plan.new_partitions:
            if start_map:
                log.info("new partition %s[%d] found; reading it from offset 0", t, p)
        return map_to_offsets(plan.end)

    def reportLatestOffset(self) -> dict | None:
        """Driver. The latest offsets seen by the last `latestOffset` call (for query progress)."""
        return map_to_offsets(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """Driver. One `KafkaRange` per partition with data, large ones split (deterministic)."""
        ranges = plan_ranges(offsets_to_map(start), offsets_to_map(end),
                             min_partitions=self.settings.min_partitions,
                             split_min_records=self.settings.split_min_records)
        return [KafkaRange(r.topic, r.partition, r.start, r.end, r.new) for r in ranges]

    def commit(self, end: dict) -> None:
        """Driver, after Spark committed the batch ending at ``end``: tell the consumer group.

        Best effort: the Spark checkpoint is the truth, a failed group commit is only logged.
        """
        self._commit_group(offsets_to_map(end))

    def _commit_group(self, offsets: dict[TP, int]) -> None:
        if not self.settings.group_id or not offsets:
            return
        if offsets == self._group_committed and not self.broker.commit_failed:
            return
        try:
            self.broker.commit_failed = False
            self.broker.commit_group(self.settings.group_id, offsets)
            self._group_committed = dict(offsets)
        except Exception as e:
            log.warning("could not commit offsets to consumer group %s (lag tools will lag behind; "
                        "the Spark checkpoint is unaffected): %s", self.settings.group_id, e)

    def stop(self) -> None:
        """Driver, when the query terminates."""
        if self._broker is not None:
            self._broker.close()
            self._broker = None

    # --- executor -------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator:
        """Executor. Yields pyarrow RecordBatches of the records in ``[start, end)``. Stateless."""
        return read_range(self.settings, partition)


# --------------------------------------------------------------------------------------------
# Executor side: read one range into Arrow
# --------------------------------------------------------------------------------------------

_ARROW_SCHEMA = None


def arrow_schema():
    """The Arrow schema Spark expects for `SCHEMA` (Spark compares it exactly)."""
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        from pyspark.sql.pandas.types import to_arrow_schema

        _ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
    return _ARROW_SCHEMA


def messages_to_batch(msgs: list, topic: str, partition: int):
    """confluent-kafka Messages (data records only) -> one pyarrow RecordBatch of `SCHEMA`."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from confluent_kafka import Message

    schema = arrow_schema()
    n = len(msgs)
    # map() over the C methods keeps the per-record Python work to a minimum (this is the hot loop)
    keys = pa.array(list(map(Message.key, msgs)), pa.binary())
    values = pa.array(list(map(Message.value, msgs)), pa.binary())
    offsets = pa.array(list(map(Message.offset, msgs)), pa.int64())
    ts_ms = pa.array([t[1] for t in map(Message.timestamp, msgs)], pa.int64())
    lowest = pc.min(ts_ms).as_py()
    if lowest is not None and lowest < 0:  # TIMESTAMP_NOT_AVAILABLE
        ts_ms = pc.if_else(pc.less(ts_ms, 0), pa.scalar(None, pa.int64()), ts_ms)
    timestamps = pc.multiply(ts_ms, 1000).cast(schema.field("timestamp").type)
    header_type = schema.field("headers").type
    hdrs = list(map(Message.headers, msgs))
    if any(hdrs):
        headers = pa.array([[{"key": k, "value": v} for k, v in h] if h else None for h in hdrs], header_type)
    else:  # null, like Spark's own Kafka source: also cheaper for the JVM than empty arrays
        headers = pa.nulls(n, header_type)
    return pa.RecordBatch.from_arrays(
        [keys, values, pa.repeat(pa.scalar(topic, pa.string()), n),
         pa.repeat(pa.scalar(partition, pa.int32()), n), offsets, timestamps, headers],
        schema=schema)


class _RangeReader:
    """Reads one KafkaRange; finishes by position, never by counting records."""

    STALL_CHECK_SECONDS = 5.0
    CHUNK = 10_000

    def __init__(self, settings: SourceSettings, r: KafkaRange):
        self.s = settings
        self.r = r
        self.pos = r.start

    def _where(self) -> str:
        r = self.r
        return f"topic {r.topic} partition {r.partition} range [{r.start}, {r.end})"

    def run(self) -> Iterator:
        from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

        r, s = self.r, self.s
        if r.end <= r.start:
            return
        consumer = Consumer(s.consumer_config())
        tp = TopicPartition(r.topic, r.partition)
        gc_was_enabled = gc.isenabled()
        gc.disable()  # building millions of small objects; the collector would dominate
        try:
            consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
            pending: list = []
            pending_n = 0
            last_progress = time.monotonic()
            last_check = last_progress
            done = False
            while not done:
                # Asking for no more than the range can hold makes consume() return as soon as the
                # range is covered instead of waiting out its timeout.
                msgs = consumer.consume(max(1, min(self.CHUNK, r.end - self.pos)), 0.5)
                data = msgs
                if any(map(Message.error, msgs)):
                    errors = [m for m in msgs if m.error() is not None]
                    data = [m for m in msgs if m.error() is None]
                    for m in errors:
                        err = m.error()
                        code = err.code()
                        if code == KafkaError._PARTITION_EOF:
                            if m.offset() >= r.end:
                                done = True
                        elif code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                            done = self._out_of_range(consumer, tp, str(err))
                            data = []  # anything fetched with the error belongs to the old position
                            break
                        elif err.fatal() or code in (KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                                     KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                                                     KafkaError._SSL, KafkaError.SASL_AUTHENTICATION_FAILED):
                            raise SourceError(f"Kafka error reading {self._where()}: {err}; check the "
                                              f"kafka.* security options")
                        else:
                            # unknown partition (just created), leader moves, transport errors:
                            # librdkafka retries; the stall check bounds how long that may take
                            log.warning("transient Kafka error reading %s: %s", self._where(), err)
                if data:
                    last_off = data[-1].offset()
                    if last_off >= r.end:
                        offs = [m.offset() for m in data]
                        data = data[:bisect.bisect_left(offs, r.end)]
                        done = True
                    self.pos = max(self.pos, last_off + 1)
                    last_progress = time.monotonic()
                    if data:
                        pending.append(data)
                        pending_n += len(data)
                if not done:
                    p = consumer.position([tp])[0].offset
                    if p is not None and p >= 0:
                        if p > self.pos:
                            self.pos = p
                            last_progress = time.monotonic()
                        if p >= r.end:
                            done = True
                if pending_n >= s.arrow_batch_rows:
                    yield self._flush(pending)
                    pending, pending_n = [], 0
                if not done:
                    now = time.monotonic()
                    if now - last_progress >= self.STALL_CHECK_SECONDS and now - last_check >= self.STALL_CHECK_SECONDS:
                        last_check = now
                        done = self._stalled(consumer, tp, now - last_progress)
            if pending_n:
                yield self._flush(pending)
        finally:
            if gc_was_enabled:
                gc.enable()
            try:
                consumer.close()
            except Exception:
                pass

    def _flush(self, pending: list):
        flat = pending[0] if len(pending) == 1 else [m for chunk in pending for m in chunk]
        return messages_to_batch(flat, self.r.topic, self.r.partition)

    def _watermarks(self, consumer, tp) -> Watermarks:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
        except Exception as e:
            raise SourceError(f"cannot read the watermarks of {self._where()} from "
                              f"{self.s.bootstrap_servers}: {e}") from None
        return Watermarks(low, high)

    def _out_of_range(self, consumer, tp, err: str) -> bool:
        """The broker does not have ``self.pos``. Returns True when the range is finished."""
        from confluent_kafka import TopicPartition

        r = self.r
        wm = self._watermarks(consumer, tp)
        if not (r.new or self.s.on_missing_offsets == "earliest"):
            raise SourceError(
                f"the broker no longer has offset {self.pos} of {self._where()} (log is now "
                f"[{wm.low}, {wm.high})): {err}. Reprocess from a new checkpoint, or set the source "
                f"option on.missing.offsets=earliest to continue from the earliest available offset.")
        if self.pos >= wm.high or wm.low >= r.end:
            log.warning("%s: offsets %d..%d are gone (log is [%d, %d)); skipping %d offsets",
                        self._where(), self.pos, r.end - 1, wm.low, wm.high, r.end - self.pos)
            return True
        if wm.low > self.pos:
            if not r.new:
                log.warning("on.missing.offsets=earliest: %s skips offsets %d..%d (%d offsets the broker "
                            "no longer has)", self._where(), self.pos, wm.low - 1, wm.low - self.pos)
            self.pos = wm.low
        consumer.assign([TopicPartition(r.topic, r.partition, self.pos)])
        return False

    def _stalled(self, consumer, tp, idle: float) -> bool:
        """No progress for a while: finish if nothing can come, raise after the read timeout."""
        r = self.r
        wm = self._watermarks(consumer, tp)
        if wm.high <= self.pos < r.end:
            # Everything the broker has is read, and it has less than was planned.
            if self.s.on_missing_offsets == "earliest":
                log.warning("%s: the log ends at %d, before the planned end; skipping offsets %d..%d",
                            self._where(), wm.high, self.pos, r.end - 1)
                return True
            raise SourceError(
                f"the broker no longer has offsets {wm.high}..{r.end - 1} of {self._where()}: its log "
                f"now ends at {wm.high} (truncated, or the topic was recreated). Reprocess from a new "
                f"checkpoint, or set on.missing.offsets=earliest to skip them.")
        if idle >= self.s.read_timeout_seconds:
            raise SourceError(
                f"no progress reading {self._where()} for {idle:.0f}s at offset {self.pos} although the "
                f"broker reports log [{wm.low}, {wm.high}); check the broker's health (raise "
                f"read.timeout.seconds if it is just slow)")
        log.info("%s: waiting at offset %d (log [%d, %d), idle %.0fs)", self._where(), self.pos,
                 wm.low, wm.high, idle)
        return False


def read_range(settings: SourceSettings, r: KafkaRange) -> Iterator:
    """Executor. The records of one range as pyarrow RecordBatches."""
    return _RangeReader(settings, r).run()


# --------------------------------------------------------------------------------------------
# Reading offsets back from a Spark checkpoint
# --------------------------------------------------------------------------------------------

def _batch_files(d: Path) -> dict[int, Path]:
    if not d.is_dir():
        return {}
    return {int(p.name): p for p in d.iterdir() if p.name.isdigit()}


def _source_offsets(path: Path) -> list[dict]:
    """The per-source offset lines of one offset-log file (first line version, second metadata)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for line in lines[2:]:
        line = line.strip()
        if not line or line == "-":
            continue
        try:
            v = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(v, str):  # a serialized offset nested as a string
            try:
                v = json.loads(v)
            except json.JSONDecodeError:
                continue
        if isinstance(v, dict):
            out.append(v)
    return out


def checkpoint_offsets(checkpoint_dir: str | Path, batch_id: int | None = None) -> dict | None:
    """End offsets (offset JSON) of a micro-batch, read from a Spark checkpoint; runs anywhere.

    Default: the last batch in ``commits/`` (fully processed). With ``batch_id``: that batch's
    planned end offsets from ``offsets/``, committed or not. None when there is no such batch.
    With several sources in one query their offsets are merged (the lower offset wins when two
    sources read the same partition, so the result never overstates progress).
    """
    cp = Path(checkpoint_dir)
    offsets = _batch_files(cp / "offsets")
    if batch_id is None:
        committed = _batch_files(cp / "commits")
        usable = sorted(b for b in committed if b in offsets)
        if not usable:
            return None
        batch_id = usable[-1]
    path = offsets.get(int(batch_id))
    if path is None:
        return None
    merged: dict[TP, int] = {}
    for src in _source_offsets(path):
        try:
            m = offsets_to_map(src)
        except SourceError:
            continue
        for tp, o in m.items():
            merged[tp] = min(o, merged.get(tp, o))
    return map_to_offsets(merged)


def last_committed_batch(checkpoint_dir: str | Path) -> int | None:
    """The id of the last micro-batch in ``commits/``, or None."""
    committed = _batch_files(Path(checkpoint_dir) / "commits")
    return max(committed) if committed else None
