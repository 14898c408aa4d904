"""Hourly page views per member: a windowed aggregation on Spark's RocksDB state store.

    [pipelines.pageviews_hourly]  job = "pageviews_hourly", topics = ["page_views"],
    options = { window = "1 hour", watermark = "2 hours" }

A job of the contract (`jobs.lib.contract.api`): ``transform(job)`` returns `Stateful` rows in update
mode, upserted by (member_id, window_start); kappa takes the rejects from the parsed records.

The Samza pattern "counting page views per user per hour" with Spark's native operator: page
views are grouped by member and 1-hour tumbling window of their event time (`viewed_at`); the
running counts live in the state store, RocksDB with changelog checkpointing (configured in
`jobs.lib.runtime.session.build_session`), so a restart replays a small changelog instead of the input.

Output mode: *update*. Every micro-batch emits the current count of each window it touched, and
the sink upserts it by (member_id, window_start). The table therefore holds complete counts of
every window, including the open ones, as soon as a batch is committed: a reprocess that ends
with `--trigger available-now` has its last hours in the table (append mode would hold windows
back until the watermark passes their end, which never happens at the end of the log).

Watermark: a view whose event time is older than (latest event time seen - watermark) when it is
read is late; Spark drops it from the aggregation and counts it in the query progress
(`numRowsDroppedByWatermark`). The delay (default 2 hours) must cover how far out of event-time
order views arrive in the live tail; windows older than the watermark are evicted from state. The
backfill of a new version is one micro-batch (source option ``backfill=one-batch``, the default):
no capped batches that let a sparse partition run ahead of a dense one in event time, so a
reprocess drops no view that a batch computation over the same log would count.
State partitions: the pipeline option ``state_partitions`` (`jobs.lib.runtime.seedjob.state_partitions`). Late views are not errors
and do not go to the rejects table; malformed records do (see `jobs.lib.source.events.PAGE_VIEW`).

Output table: member_id string, window_start timestamp, window_end timestamp, views int64.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame, functions as F

from jobs.lib.contract.api import JobInput, Stateful
from jobs.lib.runtime.seedjob import duration_options, topic_roles
from jobs.lib.source.event_columns import parse_events
from jobs.lib.source.events import PAGE_VIEW

__all__ = ["OPTIONS", "KEY_COLUMNS", "OUTPUT_SCHEMA", "OUTPUT_DDL", "counts", "transform"]

DEFAULT_WINDOW = "1 hour"
DEFAULT_WATERMARK = "2 hours"
KEY_COLUMNS = ["member_id", "window_start"]
OPTIONS = {"window": DEFAULT_WINDOW, "watermark": DEFAULT_WATERMARK}

OUTPUT_SCHEMA = pa.schema([
    pa.field("member_id", pa.string()),
    pa.field("window_start", pa.timestamp("us", tz="UTC")),
    pa.field("window_end", pa.timestamp("us", tz="UTC")),
    pa.field("views", pa.int64()),
])

OUTPUT_DDL = "member_id string, window_start timestamp, window_end timestamp, views bigint"


def transform(job: JobInput) -> Stateful:
    """The job contract's function: one topic of page views; options window and watermark."""
    topic_roles(job, ("page views",), "pageviews_hourly")
    options = duration_options(job, OPTIONS, "pageviews_hourly")
    # Source: the page views topic, parsed in the JVM (a malformed record keeps its reason in `error`).
    parsed = parse_events(job.source, PAGE_VIEW)
    # Transformation: the running count of each (member, hour), in the state store.
    rows = counts(parsed, **options)
    # Sink: every window a batch touched, upserted by (member_id, window_start); kappa takes the
    # rejects and the records read from `parsed`.
    return Stateful(rows, output_mode="update", write="upsert", parsed=parsed)


def counts(parsed: DataFrame, *, window: str = DEFAULT_WINDOW, watermark: str = DEFAULT_WATERMARK) -> DataFrame:
    """Parsed page views (`jobs.lib.source.event_columns.parse_events`) -> the updated count of each
    (member, window) they touch, `OUTPUT_DDL`."""
    return (
        parsed.where(F.col("error").isNull())
        .withWatermark("viewed_at", watermark)
        .groupBy("member_id", F.window("viewed_at", window).alias("w"))
        .agg(F.count(F.lit(1)).alias("views"))
        .select("member_id", F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
                F.col("views").cast("bigint").alias("views"))
    )
