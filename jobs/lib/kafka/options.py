"""The Kafka source's options, parsed and validated once on the driver.

Named as in Spark's own Kafka connector (``format("kafka")`` of ``spark-sql-kafka``), so a cluster
that has that connector can switch a job to it by configuration. Names are case-insensitive.

=========================  =====================================================================
option (old name)          meaning
=========================  =====================================================================
kafka.bootstrap.servers    required (``bootstrap.servers``)
subscribe                  required: comma-separated topic names (``topics``)
startingOffsets            ``earliest`` (default), ``latest`` or offset JSON ``{"t": {"0": 5}}``,
                           -2/-1 per partition (``starting.offsets``)
maxOffsetsPerTrigger       offsets per micro-batch of the live tail, default 100000
                           (``max.records.per.batch``)
failOnDataLoss             ``true`` (default): offsets the broker no longer has fail the query;
                           ``false``: continue from the earliest available offset, logging what
                           was skipped (``on.missing.offsets`` = ``fail`` | ``earliest``)
minPartitions              a large micro-batch is split into at least this many Spark tasks,
                           default 2 (``min.partitions``)
kafka.group.id             consumer group the processed offsets are committed to (``group.id``)
kafka.isolation.level      ``read_committed`` (default) or ``read_uncommitted`` (``isolation.level``)
kafka.*                    anything else: passed to librdkafka (SASL/SSL...)
backfill                   ``one-batch`` (default): a fresh query's first micro-batch reads
                           everything up to the latest offsets (the available-now target) with no
                           cap; ``capped``: every batch is capped by maxOffsetsPerTrigger
splitMinRecords            no task gets a smaller slice of a partition, 10000 (``split.min.records``)
readTimeoutSeconds         a range without progress fails after this long, 60
                           (``read.timeout.seconds``); time the broker was unreachable
                           does not count
brokerOutageSeconds        how long an unreachable broker (connection refused, requests timing
                           out, no leader) is retried with backoff before the query fails, 120
                           (``broker.outage.seconds``); bad input (an unknown topic once the
                           broker answers, authentication, a bad option) fails at once
arrowBatchRows             rows per Arrow batch a task yields, 50000 (``arrow.batch.rows``)
readProgressDir            kappa's own: where the tasks of a ``one-batch`` backfill report the
                           offsets they have read before the batch commits (the job runtime sets
                           ``<checkpoint>/kappa-read-progress``, `jobs.lib.kafka.progress`); unset:
                           no report
=========================  =====================================================================

The old dotted names stay accepted; giving both names of one option with different values is an
error, and so is any other option that does not start with ``kafka.``.

What differs from Spark's connector:

* No ``assign``, ``subscribePattern``, ``endingOffsets``, ``startingTimestamp``/``...ByTimestamp``,
  ``minOffsetsPerTrigger``/``maxTriggerDelay``, ``groupIdPrefix`` or ``includeHeaders`` (headers
  are always a column, null when a record has none).
* ``maxOffsetsPerTrigger`` defaults to 100000 instead of unlimited, is shared equally across
  partitions (what one cannot use goes to the others; Spark shares in proportion to each
  partition's backlog), and does not apply to the first batch of a fresh query under
  ``backfill=one-batch`` (Spark's connector caps that one too).
* ``kafka.group.id``: kappa commits each processed batch's offsets to this group so that lag tools
  see the query (Spark's connector only uses the group to read and never commits). The Spark
  checkpoint stays the truth about progress in both.
* ``kafka.isolation.level`` defaults to ``read_committed`` (Kafka's and so Spark's default is
  ``read_uncommitted``). A range ends by the consumer's position, so control records and
  compaction gaps are handled as in Spark.
* ``kafka.*`` options go to librdkafka (confluent-kafka), not to the Java client: names are mostly
  the same, but Java-only settings (``sasl.jaas.config``...) have librdkafka equivalents
  (``sasl.username``/``sasl.password``). Settings the source owns for correctness (auto commit,
  auto offset reset, partition EOF) cannot be overridden, as in Spark.
* A partition that appears while the query runs is read from its log start, as in Spark;
  ``failOnDataLoss=true`` does not fail on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping

from jobs.lib.kafka.planning import offsets_to_map
from orchestrator.core.exceptions import SourceError

__all__ = ["DEFAULT_MAX_RECORDS", "DEFAULT_BROKER_OUTAGE_SECONDS", "MISSING_POLICIES", "ISOLATION_LEVELS", "BACKFILL_MODES", "OPTION_NAMES",
           "canonical_option", "SourceSettings"]

DEFAULT_MAX_RECORDS = 100_000
#: Default of ``brokerOutageSeconds``: a broker restart or a network blip of a minute is ridden out.
DEFAULT_BROKER_OUTAGE_SECONDS = 120.0
MISSING_POLICIES = ("fail", "earliest")
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
BACKFILL_MODES = ("one-batch", "capped")

#: primary name -> its old (dotted) name, or None
OPTION_NAMES: dict[str, str | None] = {
    "kafka.bootstrap.servers": "bootstrap.servers",
    "subscribe": "topics",
    "startingOffsets": "starting.offsets",
    "maxOffsetsPerTrigger": "max.records.per.batch",
    "failOnDataLoss": "on.missing.offsets",
    "minPartitions": "min.partitions",
    "kafka.group.id": "group.id",
    "kafka.isolation.level": "isolation.level",
    "backfill": None,
    "splitMinRecords": "split.min.records",
    "readTimeoutSeconds": "read.timeout.seconds",
    "brokerOutageSeconds": "broker.outage.seconds",
    "arrowBatchRows": "arrow.batch.rows",
    "readProgressDir": None,
}
_BY_LOWER = {**{k.lower(): k for k in OPTION_NAMES},
             **{v: k for k, v in OPTION_NAMES.items() if v is not None}}
_UNSUPPORTED = ("assign", "subscribePattern", "endingOffsets", "startingTimestamp",
                "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy", "endingTimestamp",
                "endingOffsetsByTimestamp", "minOffsetsPerTrigger", "maxTriggerDelay", "groupIdPrefix",
                "includeHeaders", "maxRecordsPerPartition")


def canonical_option(name: str) -> str:
    """The primary name of a source option given by either of its names (any case); other
    ``kafka.*`` options and unknown names come back lower-cased."""
    return _BY_LOWER.get(str(name).lower(), str(name).lower())


def _accepted() -> str:
    return ", ".join(OPTION_NAMES) + " and other kafka.* (old names: " + \
        ", ".join(v for v in OPTION_NAMES.values() if v) + ")"


def _resolve(options: Mapping[str, str]) -> dict[str, str]:
    """Options by primary name. failOnDataLoss is given as fail|earliest (its old name's values)."""
    out: dict[str, str] = {}
    given_as: dict[str, str] = {}
    unsupported = {u.lower(): u for u in _UNSUPPORTED}
    for k, v in dict(options).items():
        low = str(k).lower()
        if low in unsupported:
            raise SourceError(f"source option {unsupported[low]} of Spark's Kafka connector is not supported "
                              f"by kappa_kafka; accepted options: {_accepted()}")
        name = canonical_option(k)
        if name not in OPTION_NAMES and not name.startswith("kafka."):
            raise SourceError(f"unknown source option {k!r}; accepted options: {_accepted()}")
        value = "" if v is None else str(v).strip()
        if name == "failOnDataLoss":
            value = _missing_policy(str(k), value)
        if name in out and out[name] != value:
            raise SourceError(f"source options {given_as[name]}={options[given_as[name]]!r} and {k}={v!r} "
                              f"name the same option ({name}) with different values; give only {name}")
        out[name] = value
        given_as[name] = str(k)
    return out


def _missing_policy(given: str, value: str) -> str:
    low = value.lower()
    if given.lower() == "on.missing.offsets":
        if low in MISSING_POLICIES:
            return low
        raise SourceError(f"source option on.missing.offsets must be one of {', '.join(MISSING_POLICIES)}, "
                          f"got {value!r} (its new name is failOnDataLoss=true|false)")
    if low in ("true", ""):
        return "fail"
    if low == "false":
        return "earliest"
    raise SourceError(f"source option failOnDataLoss must be true or false, got {value!r}")


def _int_option(opts: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = opts.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        v = int(str(raw).strip())
    except ValueError:
        raise SourceError(f"source option {name} must be an integer, got {raw!r}") from None
    if v < minimum:
        raise SourceError(f"source option {name} must be at least {minimum}, got {v}")
    return v


def _seconds_option(opts: Mapping[str, str], name: str, default: float) -> float:
    raw = opts.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        v = float(str(raw).strip())
    except ValueError:
        raise SourceError(f"source option {name} must be a number of seconds, got {raw!r}") from None
    if not v >= 0 or v == float("inf"):
        raise SourceError(f"source option {name} must be a finite number of seconds, 0 or more, got {raw!r}")
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
    backfill: str = "one-batch"
    broker_outage_seconds: float = DEFAULT_BROKER_OUTAGE_SECONDS
    read_progress_dir: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "SourceSettings":
        opts = _resolve(options)
        bootstrap = opts.get("kafka.bootstrap.servers", "")
        if not bootstrap:
            raise SourceError("source option kafka.bootstrap.servers is required, e.g. "
                              ".option('kafka.bootstrap.servers', '127.0.0.1:9092')")
        topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
        if not topics:
            raise SourceError("source option subscribe is required: a comma-separated list of topic names")
        missing = opts.get("failOnDataLoss") or "fail"
        iso = (opts.get("kafka.isolation.level") or "read_committed").lower()
        if iso not in ISOLATION_LEVELS:
            raise SourceError(f"source option kafka.isolation.level must be one of {', '.join(ISOLATION_LEVELS)}, "
                              f"got {iso!r}")
        backfill = (opts.get("backfill") or "one-batch").lower()
        if backfill not in BACKFILL_MODES:
            raise SourceError(f"source option backfill must be one of {', '.join(BACKFILL_MODES)}, got {backfill!r}")
        starting = opts.get("startingOffsets") or "earliest"
        if starting.lower() in ("earliest", "latest"):
            starting = starting.lower()
        else:
            try:
                parsed = json.loads(starting)
            except json.JSONDecodeError as e:
                raise SourceError(f"source option startingOffsets must be earliest, latest or offset JSON "
                                  f"like {{\"topic\": {{\"0\": 5}}}}: {e}") from None
            offsets_to_map(parsed)
            unknown = sorted(set(parsed) - set(topics))
            if unknown:
                raise SourceError(f"source option startingOffsets names topics not in subscribe: {unknown}")
            starting = json.dumps(parsed, sort_keys=True)
        timeout = opts.get("readTimeoutSeconds")
        try:
            read_timeout = float(timeout) if timeout else 60.0
        except ValueError:
            raise SourceError(f"source option readTimeoutSeconds must be a number, got {timeout!r}") from None
        outage = _seconds_option(opts, "brokerOutageSeconds", DEFAULT_BROKER_OUTAGE_SECONDS)
        kafka = tuple(sorted((k[len("kafka."):], v) for k, v in opts.items()
                             if k.startswith("kafka.") and k not in OPTION_NAMES))
        return cls(
            bootstrap_servers=bootstrap,
            topics=topics,
            group_id=opts.get("kafka.group.id") or None,
            max_records_per_batch=_int_option(opts, "maxOffsetsPerTrigger", DEFAULT_MAX_RECORDS, 1),
            starting_offsets=starting,
            on_missing_offsets=missing,
            isolation_level=iso,
            kafka=kafka,
            min_partitions=_int_option(opts, "minPartitions", 2, 1),
            split_min_records=_int_option(opts, "splitMinRecords", 10_000, 1),
            read_timeout_seconds=read_timeout,
            arrow_batch_rows=_int_option(opts, "arrowBatchRows", 50_000, 1),
            backfill=backfill,
            broker_outage_seconds=outage,
            read_progress_dir=opts.get("readProgressDir") or None,
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
