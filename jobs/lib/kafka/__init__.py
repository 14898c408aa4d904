"""Kafka as a Spark streaming source, on Spark's Python Data Source API and confluent-kafka.

    spark.readStream.format("kappa_kafka")
        .option("kafka.bootstrap.servers", "127.0.0.1:9092")
        .option("subscribe", "member_profiles")
        .option("kafka.group.id", "kappa.standardize.v3")   # optional: lag visible to Kafka tools
        .load()

The options are named as in Spark's own Kafka connector (`options` lists them, their old names
and what differs), so a cluster with ``spark-sql-kafka`` can switch a job to ``format("kafka")``.

Why a Python source: Spark's own Kafka connector is a JAR that cannot be fetched on these
machines; this one runs on any Spark 4.2 from PyPI.

Rows: ``key`` binary, ``value`` binary (null: tombstone), ``topic``, ``partition``, ``offset``,
``timestamp``, ``headers`` array<struct<key, value>> (null when the record carries none, as in
Spark's own Kafka source).

Offsets are Spark's offset JSON, a plain dict ``{"topic": {"0": 120, "1": 98}}`` giving the NEXT
offset to read per partition; they live in ``<checkpoint>/offsets/<batch_id>``, which is the truth
about what a query has processed (the consumer-group commits are a courtesy for lag tools).
A broker that cannot be reached (restart, pause, network) is waited for with backoff for
``brokerOutageSeconds`` (default 120) before the query fails with a ``SourceError`` starting
``broker unavailable:``; bad input (unknown topic, authentication, bad options) fails at once.
Offsets the broker no longer has (log start moved past a checkpointed offset, or the log ends
before it): ``SourceError`` by default; with ``failOnDataLoss=false`` the source continues from
the earliest available offset and logs how many offsets it skipped. Partitions that appear
while the query runs start at offset 0 (their earliest offset, if the log start moved already).

The package, in the order a micro-batch meets it:

* `options`: the source options, parsed once on the driver (`SourceSettings`, picklable);
* `source`: `KafkaDataSource` and `KafkaStreamReader`, the Spark contract (which method runs on
  the driver and which on an executor is documented there);
* `broker`: driver-side metadata, watermarks and consumer-group commits;
* `outage`: which Kafka errors mean an unreachable broker, waited out for ``brokerOutageSeconds``;
* `planning`: pure offset arithmetic, end offsets and task ranges of a micro-batch;
* `reading`: the executor side, one offset range into pyarrow RecordBatches;
* `checkpoint`: a query's offsets read back from its Spark checkpoint (runs anywhere);
* `progress`: what a one-batch backfill's tasks have read before it commits (runs anywhere).
"""

from jobs.lib.kafka.broker import commit_group_offsets
from jobs.lib.kafka.checkpoint import checkpoint_offsets, last_committed_batch
from jobs.lib.kafka.options import SourceSettings
from jobs.lib.kafka.planning import (
    TP,
    Plan,
    RangeSpec,
    Watermarks,
    map_to_offsets,
    merge_offsets,
    offsets_to_map,
    plan_end_offsets,
    plan_ranges,
    split_cap,
)
from jobs.lib.kafka.reading import SCHEMA, KafkaRange, arrow_schema, messages_to_batch, read_range
from jobs.lib.kafka.source import NAME, KafkaDataSource, KafkaStreamReader

__all__ = [
    "NAME", "SCHEMA", "TP",
    "SourceSettings",
    "KafkaDataSource", "KafkaStreamReader", "KafkaRange",
    "offsets_to_map", "map_to_offsets", "merge_offsets", "split_cap", "Watermarks", "Plan", "plan_end_offsets",
    "RangeSpec", "plan_ranges",
    "arrow_schema", "messages_to_batch", "read_range",
    "checkpoint_offsets", "last_committed_batch", "commit_group_offsets",
]
