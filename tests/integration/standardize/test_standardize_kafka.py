"""The standardize job on Spark's Kafka source where a Kafka log is not a plain run of offsets: aborted
transactions (never in the table), records deleted before the version read them (DeleteRecords
moves the log start past its checkpoint: refused by default, skipped under failOnDataLoss=false),
partitions added while it runs (read from their log start). Compaction gaps:
tests/integration/control/test_control_compaction.py. Real broker, Spark and Delta."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from std_helpers import V2, run_in_process

from orchestrator.core.tables import read_table
from orchestrator.dev.datagen import ensure_topic
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def profile(name: str) -> bytes:
    return json.dumps({"name": name, "title": "swe", "company": "Acme"}).encode()


def members(uri) -> dict[str, str]:
    return {r["member_id"]: r["name"] for r in read_table(uri).to_pylist()}


def _produce(bootstrap: str, topic: str, names: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for name in names:
        p.produce(topic, key=name.encode(), value=profile(name), partition=0)
    p.flush(30)


def retained_topic(bootstrap: str, topic: str, names: list[str]) -> str:
    """A one-partition topic with delete retention (DeleteRecords needs that, not compaction),
    holding a profile per name (its key)."""
    ensure_topic(bootstrap, topic, partitions=1, compact=False, topic_config={"retention.ms": "-1"})
    _produce(bootstrap, topic, names)
    return topic


def delete_after_producing(bootstrap: str, topic: str, names: list[str], *, log_start: int) -> None:
    """Profiles for `names`, then DeleteRecords moves the log start to `log_start`."""
    _produce(bootstrap, topic, names)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.delete_records([TopicPartition(topic, 0, log_start)]).values():
        f.result(timeout=30)


def test_aborted_transactions_never_reach_the_table(spark, bootstrap, unique, paths):
    topic = f"abort_{unique}"
    ensure_topic(bootstrap, topic, partitions=2)
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx_{uuid.uuid4().hex}"})
    p.init_transactions(30)
    committed = {}
    for txn in range(6):
        p.begin_transaction()
        for part in (0, 1):
            key = f"t{txn}p{part}"
            p.produce(topic, key=key.encode(), value=profile(f"n{txn}"), partition=part)
            if txn % 2 == 0:
                committed[key] = f"n{txn}"
        p.commit_transaction(30) if txn % 2 == 0 else p.abort_transaction(30)
    args = paths.args(bootstrap, topic, V2.path)
    run_in_process(spark, bootstrap, topic, args, V2, max_records=3)
    assert members(paths.output) == committed
    assert read_table(paths.rejects).num_rows == 0


def test_records_deleted_before_the_version_read_them_are_refused_then_skipped_when_asked(
        spark, bootstrap, unique, paths):
    topic = retained_topic(bootstrap, f"retained_{unique}", [f"a{i}" for i in range(5)])
    args = paths.args(bootstrap, topic, V2.path)
    run_in_process(spark, bootstrap, topic, args, V2)
    delete_after_producing(bootstrap, topic, [f"b{i}" for i in range(10)], log_start=12)
    with pytest.raises(Exception) as failed:
        run_in_process(spark, bootstrap, topic, args, V2)
    message = str(failed.value)
    assert f"micro-batch 1: records lost before the version read them: {topic}[0] next offset 5 < log start 12 " \
           f"(7 offsets deleted before the version read them)" in message and "failOnDataLoss = false" in message
    assert set(members(paths.output)) == {f"a{i}" for i in range(5)}          # nothing of the batch written

    args.extra = {"source_options": {"failOnDataLoss": "false"}}
    run_in_process(spark, bootstrap, topic, args, V2)
    assert set(members(paths.output)) == {f"a{i}" for i in range(5)} | {"b7", "b8", "b9"}


def test_a_version_that_goes_on_past_lost_records_reads_them_in_one_task_per_partition(spark, bootstrap, unique,
                                                                                         paths):
    """Spark's source returns a pooled consumer on an out-of-range offset and goes on polling it, while
    another task of the same partition may borrow it (see `jobs.lib.runtime.stream.SPLIT_OPTIONS`). With
    the cores' minPartitions (96 here, for tasks that start often) the batch over the lost range failed with
    "KafkaConsumer is not safe for multi-threaded access" in 4 runs of 4 before kappa stopped splitting
    such a version's partitions."""
    topic = retained_topic(bootstrap, f"lostsplit_{unique}", ["a0"])
    args = paths.args(bootstrap, topic, V2.path)
    args.extra = {"source_options": {"failOnDataLoss": "false"}}
    run_in_process(spark, bootstrap, topic, args, V2, min_partitions=96)
    delete_after_producing(bootstrap, topic, [f"m{i}" for i in range(8000)], log_start=7001)
    run_in_process(spark, bootstrap, topic, args, V2, min_partitions=96, max_records=10_000)
    assert set(members(paths.output)) == {"a0"} | {f"m{i}" for i in range(7000, 8000)}


def test_partitions_added_while_the_version_runs_are_read_from_their_start(spark, bootstrap, unique, paths):
    topic = f"addp_{unique}"
    ensure_topic(bootstrap, topic, partitions=1)
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topic, key=b"m0", value=profile("zero"), partition=0)
    p.flush(30)
    args = paths.args(bootstrap, topic, V2.path)
    run_in_process(spark, bootstrap, topic, args, V2)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(timeout=30)
    p = Producer({"bootstrap.servers": bootstrap})     # a producer whose metadata knows the new partitions
    wait_until(lambda: len(p.list_topics(topic, timeout=10).topics[topic].partitions) == 3,
               "the producer to see 3 partitions", 30)
    for part, key in ((1, b"m1"), (2, b"m2")):
        p.produce(topic, key=key, value=profile(key.decode()), partition=part)
    p.flush(30)
    run_in_process(spark, bootstrap, topic, args, V2)
    assert members(paths.output) == {"m0": "zero", "m1": "m1", "m2": "m2"}
