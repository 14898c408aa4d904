"""The plain Spark pipelines the benchmarks measure kappa against, in the same run.

What a data engineer would write without kappa, from Spark's and Delta's own examples: Spark's Kafka
source, ``from_json`` with the profile schema, the latest row per key (by partition and offset), a
Delta write from ``foreachBatch``. `start_plain_query` is one available-now pass into an empty table
(`kappa bench reprocess`); `start_plain_live_query` runs with a processing-time trigger, its first
batch an append and every later one Delta's MERGE on the key (`kappa bench freshness`). No validation
beyond ``from_json``'s (a malformed value reads as nulls), no rejects table, no rules, no idempotent
commits: the ratio of kappa's figure to this one's is what kappa's own work costs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PROFILE_SCHEMA", "PLAIN_GROUP", "latest_per_key", "start_plain_query", "start_plain_live_query"]

PROFILE_SCHEMA = "name string, title string, company string, location string, updated_at string"
#: The Spark job group of a live plain micro-batch (`event_log_jobs` counts a batch's jobs by group).
PLAIN_GROUP = "plain-batch-"


def latest_per_key(batch: Any) -> Any:
    """The latest record per key of a micro-batch, as the output's columns and ``deleted``."""
    from pyspark.sql import functions as F

    latest = (batch.groupBy("member_id")
              .agg(F.max_by(F.struct("p", "deleted", "partition", "offset", "timestamp"),
                            F.struct("partition", "offset")).alias("r"))
              .select("member_id", "r.*"))
    return latest.select("member_id", "p.*", "deleted", F.col("partition").alias("source_partition"),
                         F.col("offset").alias("source_offset"), F.col("timestamp").alias("source_timestamp"))


def _records(spark: Any, bootstrap_servers: str, topic: str, kafka_options: dict[str, str] | None) -> Any:
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap_servers)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    for k, v in (kafka_options or {}).items():
        reader = reader.option(k, v)
    return reader.load().select(F.col("key").cast("string").alias("member_id"),
                                F.from_json(F.col("value").cast("string"), PROFILE_SCHEMA).alias("p"),
                                F.col("value").isNull().alias("deleted"), "partition", "offset", "timestamp")


def start_plain_query(spark: Any, bootstrap_servers: str, topic: str, output: str, checkpoint: str,
                      kafka_options: dict[str, str] | None = None) -> Any:
    """Start the plain pipeline's available-now query over `topic` into the Delta table `output`."""
    from pyspark.sql import functions as F

    def write(batch: Any, batch_id: int) -> None:
        latest_per_key(batch).where(~F.col("deleted")).drop("deleted").write.format("delta").mode("append").save(output)

    return (_records(spark, bootstrap_servers, topic, kafka_options).writeStream.foreachBatch(write)
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())


def start_plain_live_query(spark: Any, bootstrap_servers: str, topic: str, output: str, checkpoint: str,
                           interval_seconds: float, kafka_options: dict[str, str] | None = None) -> Any:
    """Start the plain pipeline's live query over `topic` into `output`: a processing-time trigger of
    `interval_seconds`; the first batch appended, each later one MERGEd on the key (Delta's example:
    a tombstone deletes, the rest update or insert)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    def write(batch: Any, batch_id: int) -> None:
        spark.sparkContext.setJobGroup(f"{PLAIN_GROUP}{batch_id}", f"plain pipeline: micro-batch {batch_id}")
        latest = latest_per_key(batch)
        if not DeltaTable.isDeltaTable(spark, output):
            latest.where(~F.col("deleted")).drop("deleted").write.format("delta").mode("append").save(output)
            return
        columns = {c: F.col(f"s.`{c}`") for c in latest.columns if c != "deleted"}
        (DeltaTable.forPath(spark, output).alias("t").merge(latest.alias("s"), "t.member_id = s.member_id")
         .whenMatchedDelete(condition="s.deleted").whenMatchedUpdate(condition="NOT s.deleted", set=columns)
         .whenNotMatchedInsert(condition="NOT s.deleted", values=columns).execute())

    return (_records(spark, bootstrap_servers, topic, kafka_options).writeStream.foreachBatch(write)
            .option("checkpointLocation", checkpoint).trigger(processingTime=f"{interval_seconds} seconds").start())
