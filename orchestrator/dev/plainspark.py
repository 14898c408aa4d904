"""The plain Spark pipeline that `kappa bench reprocess` measures kappa against, in the same run.

What a data engineer would write without kappa, from Spark's and Delta's own examples: Spark's Kafka
source, ``from_json`` with the profile schema, the latest row per key (by partition and offset), a
Delta write from ``foreachBatch``, one available-now pass. No validation beyond ``from_json``'s (a
malformed value reads as nulls), no rejects table, no rules, no idempotent commits: the ratio of
kappa's throughput to this one's is what kappa's own work costs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PROFILE_SCHEMA", "start_plain_query"]

PROFILE_SCHEMA = "name string, title string, company string, location string, updated_at string"


def start_plain_query(spark: Any, bootstrap_servers: str, topic: str, output: str, checkpoint: str,
                      kafka_options: dict[str, str] | None = None) -> Any:
    """Start the plain pipeline's available-now query over `topic` into the Delta table `output`."""
    from pyspark.sql import functions as F

    def write(batch: Any, batch_id: int) -> None:
        latest = (batch.groupBy("member_id")
                  .agg(F.max_by(F.struct("p", "deleted", "partition", "offset", "timestamp"),
                                F.struct("partition", "offset")).alias("r"))
                  .select("member_id", "r.*"))
        (latest.where(~F.col("deleted"))
         .select("member_id", "p.*", F.col("partition").alias("source_partition"),
                 F.col("offset").alias("source_offset"), F.col("timestamp").alias("source_timestamp"))
         .write.format("delta").mode("append").save(output))

    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap_servers)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    for k, v in (kafka_options or {}).items():
        reader = reader.option(k, v)
    rows = reader.load().select(F.col("key").cast("string").alias("member_id"),
                                F.from_json(F.col("value").cast("string"), PROFILE_SCHEMA).alias("p"),
                                F.col("value").isNull().alias("deleted"), "partition", "offset", "timestamp")
    return (rows.writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
            .trigger(availableNow=True).start())
