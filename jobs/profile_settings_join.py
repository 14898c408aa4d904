"""Member profiles joined to member settings by member id: a table-table join of two changelogs.

    [pipelines.profile_settings_join]  job = "profile_settings_join",
    topics = ["member_profiles", "member_settings"]

A job of the contract (`jobs.lib.contract.api`): ``transform(job)`` returns `Stateful` rows in update
mode, upserted by member_id. The pipeline's topics name the profiles topic first, the settings
topic second. Both are compacted
changelogs keyed by member id (the Kafka key, UTF-8); a tombstone (null value) deletes that side.

The Samza implementation: one key-value store keyed by member id holds the latest profile and the
latest settings; a change on either side updates its half and emits the new joined record. Here
that store is a streaming aggregation in the JVM over the union of both topics (one source),
grouped by member id, on the RocksDB state store with changelog checkpointing: per side, ``max_by``
of the side's record (fields, offset, tombstone) by its (partition, offset). A key lives in one
partition of each topic, so the latest record of each side wins exactly as compaction would keep
it. Records are parsed in the JVM too (`jobs.lib.source.event_columns.parse_events`).

Emission and output: for every member touched in a micro-batch the function emits the joined
record as of the end of the batch (the intermediate joins of one batch would be overwritten by the
same upsert), and the sink upserts by member_id:

* profile present, settings present: the full row;
* profile present, no settings (never seen, or tombstoned): the row with null settings columns
  (left-outer from the profile's side: a member exists when their profile does);
* no profile (never seen, or tombstoned): the row is deleted (`_deleted`); settings that arrive
  for a member without a profile are kept in state and joined when the profile appears.

A malformed record (bad key, not JSON, wrong field type) goes to the rejects table and leaves its
side unchanged. Output table columns: member_id, name, title, company, location, zip, language,
email_notifications, visibility, profile_offset, settings_offset (offsets of the records the row
is made of).
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame, functions as F

from jobs.lib.contract.api import JobInput, Stateful
from jobs.lib.runtime.seedjob import duration_options, topic_roles
from jobs.lib.source.event_columns import parse_events
from jobs.lib.source.events import PROFILE, SETTINGS

__all__ = ["KEY_COLUMNS", "OUTPUT_SCHEMA", "OUTPUT_DDL", "join", "transform"]

KEY_COLUMNS = ["member_id"]

OUTPUT_SCHEMA = pa.schema(
    [pa.field("member_id", pa.string())]
    + list(PROFILE.arrow_schema()) + list(SETTINGS.arrow_schema())
    + [pa.field("profile_offset", pa.int64()), pa.field("settings_offset", pa.int64())]
)

OUTPUT_DDL = (
    "member_id string, " + PROFILE.spark_ddl() + ", " + SETTINGS.spark_ddl()
    + ", profile_offset bigint, settings_offset bigint, _deleted boolean"
)
_RAW = ["key", "value", "topic", "partition", "offset", "timestamp"]


def transform(job: JobInput) -> Stateful:
    """The job contract's function: topics profiles then settings, one source over both; no options."""
    profiles, settings = topic_roles(job, ("member profiles", "member settings"), "profile_settings_join")
    duration_options(job, {}, "profile_settings_join")
    # Source: one Kafka stream over both topics.
    source = job.source
    # Transformation: each side's latest record per member (a tombstone deletes it), joined.
    joined, parsed = join(source, profiles, settings)
    # Sink: upserted by member_id (`_deleted` deletes); kappa takes the rejects and the records read
    # from `parsed`.
    return Stateful(joined, output_mode="update", write="upsert", parsed=parsed)


def join(source: DataFrame, profiles_topic: str, settings_topic: str) -> tuple[DataFrame, DataFrame]:
    """Kafka rows of both topics -> (joined rows to upsert, `_deleted` marking deletes; every record
    read with its ``error``, null for a good record or a tombstone)."""
    recs = source.select(*_RAW)
    key_ok = F.col("key").isNotNull() & F.expr("is_valid_utf8(key)") & (F.length("key") > 0)
    tomb = F.col("value").isNull() & key_ok
    is_profile = F.col("topic") == profiles_topic
    prof = parse_events(recs.where(is_profile & ~tomb), PROFILE, key_as="member_id")
    sett = parse_events(recs.where(~is_profile & ~tomb), SETTINGS, key_as="member_id")
    p = _side(prof, recs.where(is_profile & tomb), PROFILE, "p")
    s = _side(sett, recs.where(~is_profile & tomb), SETTINGS, "s")
    both = p.withColumn("s", F.lit(None).cast(s.schema["s"].dataType)).unionByName(
        s.withColumn("p", F.lit(None).cast(p.schema["p"].dataType)))
    latest = both.groupBy("member_id").agg(
        F.max_by("p", F.when(F.col("p").isNotNull(), F.col("order"))).alias("p"),
        F.max_by("s", F.when(F.col("s").isNotNull(), F.col("order"))).alias("s"))
    has_p = F.col("p").isNotNull() & ~F.col("p.gone")
    has_s = has_p & F.col("s").isNotNull() & ~F.col("s.gone")
    joined = latest.select(
        "member_id",
        *[F.when(has_p, F.col(f"p.{n}")).alias(n) for n in PROFILE.fields],
        *[F.when(has_s, F.col(f"s.{n}")).alias(n) for n in SETTINGS.fields],
        F.when(has_p, F.col("p.offset")).alias("profile_offset"),
        F.when(has_s, F.col("s.offset")).alias("settings_offset"),
        (~has_p).alias("_deleted"))
    counted = prof.unionByName(sett, allowMissingColumns=True).select("key", "value", "topic", "partition", "offset",
                                                                      "error")
    tombs = recs.where(tomb).select("key", "value", "topic", "partition", "offset",
                                    F.lit(None).cast("string").alias("error"))
    return joined, counted.unionByName(tombs)


def _side(parsed: DataFrame, tombstones: DataFrame, et, name: str) -> DataFrame:
    """One side's valid records and tombstones as (member_id, side struct, its order)."""
    fields = list(et.fields)
    valid = parsed.where(F.col("error").isNull()).select(
        "member_id", *fields, "partition", "offset", F.lit(False).alias("gone"))
    gone = tombstones.select(F.col("key").cast("string").alias("member_id"),
                             *[F.lit(None).cast(valid.schema[n].dataType).alias(n) for n in fields],
                             "partition", "offset", F.lit(True).alias("gone"))
    return valid.unionByName(gone).select(
        "member_id", F.struct(*fields, "offset", "gone").alias(name), F.struct("partition", "offset").alias("order"))
