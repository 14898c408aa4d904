"""Ad clicks joined to their impressions within a time bound: a stream-stream join.

    [pipelines.ad_click_join]  job = "ad_click_join", topics = ["ad_impressions", "ad_clicks"],
    options = { bound = "10 minutes", impressions_watermark = "10 minutes", clicks_watermark = "10 minutes" }

A job of the contract (`jobs.lib.contract.api`): ``transform(job)`` returns `Stateful` pairs, appended.

`--topics` names the impressions topic first, the clicks topic second; both keyed by impression id.
Spark's native inner stream-stream join with a watermark on each side and a time-range condition:
a click joins its impression (same impression_id) when

    shown_at <= clicked_at <= shown_at + bound            (bound: default 10 minutes)

Both sides are buffered in the state store (RocksDB, changelog checkpointing) — the two Samza
stores of the pattern. The watermarks let Spark evict an impression once no click within the bound
can still arrive, and a click once no impression can still match it; the global watermark is the
minimum of both (Spark's default policy), so the slower topic holds eviction back. A delay must
cover how far out of event-time order events arrive in the live tail; events older than the
watermark are dropped as late (not rejects). The backfill of a new version is one micro-batch
(source option ``backfill=one-batch``, the default), so partitions of different event density do
not drift apart in event time and a reprocess joins every pair a batch join over the same log
finds. State partitions: the pipeline option ``state_partitions``. Each pair is emitted once (append output mode) and appended to Delta idempotently.
Clicks without an impression in the bound, and impressions never clicked, produce no row (inner).

Each topic is its own source, so each join input reads only its topic; the rejects branch (a
stateless union of both sides' malformed records) reads them once more.

Output table columns: impression_id, ad_id, member_id, shown_at, click_id, clicked_at.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame, functions as F

from jobs.lib.contract.api import JobInput, Stateful
from jobs.lib.runtime.seedjob import duration_options, topic_roles
from jobs.lib.source.event_columns import parse_events
from jobs.lib.source.events import AD_CLICK, AD_IMPRESSION

__all__ = ["OPTIONS", "OUTPUT_SCHEMA", "OUTPUT_DDL", "pairs", "transform"]

DEFAULT_BOUND = "10 minutes"
DEFAULT_WATERMARK = "10 minutes"
OPTIONS = {"bound": DEFAULT_BOUND, "impressions_watermark": DEFAULT_WATERMARK,
           "clicks_watermark": DEFAULT_WATERMARK}

OUTPUT_SCHEMA = pa.schema([
    pa.field("impression_id", pa.string()),
    pa.field("ad_id", pa.string()),
    pa.field("member_id", pa.string()),
    pa.field("shown_at", pa.timestamp("us", tz="UTC")),
    pa.field("click_id", pa.string()),
    pa.field("clicked_at", pa.timestamp("us", tz="UTC")),
])

OUTPUT_DDL = ("impression_id string, ad_id string, member_id string, shown_at timestamp, click_id string, "
              "clicked_at timestamp")


def transform(job: JobInput) -> Stateful:
    """The job contract's function: topics impressions then clicks, each its own source (both commit
    to the version's consumer group); options bound and the two watermarks."""
    impressions, clicks = topic_roles(job, ("ad impressions", "ad clicks"), "ad_click_join")
    # Source: one Kafka stream per topic.
    impression_records, click_records = job.read(impressions), job.read(clicks)
    options = duration_options(job, OPTIONS, "ad_click_join")
    # Transformation: both sides parsed and watermarked, each click joined to its impression within the bound.
    out, parsed = pairs(impression_records, click_records, **options)
    # Sink: the pairs appended; kappa takes the rejects and the records read from `parsed`.
    return Stateful(out, output_mode="append", write="append", parsed=parsed)


def pairs(impressions: DataFrame, clicks: DataFrame, *, bound: str = DEFAULT_BOUND,
          impressions_watermark: str = DEFAULT_WATERMARK,
          clicks_watermark: str = DEFAULT_WATERMARK) -> tuple[DataFrame, DataFrame]:
    """Kafka rows of the impressions and clicks topics -> (joined pairs, `OUTPUT_DDL`; every record
    read, parsed, with its ``error``)."""
    imps = parse_events(impressions, AD_IMPRESSION)
    clks = parse_events(clicks, AD_CLICK)
    i = (imps.where(F.col("error").isNull())
         .select("impression_id", "ad_id", "member_id", "shown_at")
         .withWatermark("shown_at", impressions_watermark))
    c = (clks.where(F.col("error").isNull())
         .select(F.col("impression_id").alias("click_impression_id"), "click_id", "clicked_at")
         .withWatermark("clicked_at", clicks_watermark))
    joined = i.join(c, F.expr(
        f"click_impression_id = impression_id AND clicked_at >= shown_at "
        f"AND clicked_at <= shown_at + INTERVAL {bound}"), "inner")
    out = joined.select("impression_id", "ad_id", "member_id", "shown_at", "click_id", "clicked_at")
    cols = ["key", "value", "topic", "partition", "offset", "error"]
    return out, imps.select(*cols).unionByName(clks.select(*cols))
