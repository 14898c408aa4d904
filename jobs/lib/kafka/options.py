"""The Kafka source's options, parsed and validated once on the driver.

Besides the Python Data Source contract's: ``bootstrap.servers`` and ``topics`` (required),
``group.id`` (optional: lag visible to Kafka tools), ``max.records.per.batch`` (100000),
``starting.offsets`` (``earliest``, ``latest`` or offset JSON, -2/-1 per partition),
``on.missing.offsets`` (``fail`` or ``earliest``), ``isolation.level`` (``read_committed``),
``min.partitions`` (default 2: a micro-batch is split into at least this many Spark tasks when it
is large enough), ``split.min.records`` (10000: no task gets a smaller slice of a partition),
``read.timeout.seconds`` (60), ``arrow.batch.rows`` (50000), and ``kafka.*`` passed through to
every client (SASL/SSL...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping

from jobs.lib.kafka.planning import offsets_to_map
from orchestrator.core.exceptions import SourceError

__all__ = ["DEFAULT_MAX_RECORDS", "MISSING_POLICIES", "ISOLATION_LEVELS", "SourceSettings"]

DEFAULT_MAX_RECORDS = 100_000
MISSING_POLICIES = ("fail", "earliest")
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


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
