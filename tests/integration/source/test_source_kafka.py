"""The kappa_kafka source against a real broker (the embedded Apache Kafka) and a real local Spark."""

from __future__ import annotations

import time

import pytest

from jobs.lib.kafka import checkpoint_offsets
from tests.integration.source.source_helpers import (
    WAIT_SECONDS,
    await_failure,
    read_parquet_rows,
    run_available_now,
    source,
)

pytestmark = pytest.mark.integration


def _key(r):
    return (r["topic"], r["partition"], r["offset"])


def test_reads_everything_from_offset_zero_in_capped_batches(spark, kafka, unique, tmp_path):
    topic = kafka.create_topic(f"everything_{unique}", partitions=3)
    records, expected = [], []
    next_offset = [0, 0, 0]
    for i in range(600):
        p = i % 3
        key = None if i == 4 else f"k{i % 150}".encode()
        value = None if i % 7 == 0 else f"v{i} ünïcode".encode()
        headers = [("src", b"test"), ("n", str(i).encode())] if i % 5 == 0 else None
        records.append((p, key, value, headers))
        expected.append({"key": key, "value": value, "topic": topic, "partition": p, "offset": next_offset[p],
                         "headers": [{"key": k, "value": v} for k, v in headers] if headers else None})
        next_offset[p] += 1
    kafka.produce(topic, records)
    group = f"g_{unique}"

    df = source(spark, kafka.bootstrap, topic, **{"maxOffsetsPerTrigger": 100, "kafka.group.id": group,
                                                   "backfill": "capped"})
    rows, progress = run_available_now(spark, df, f"everything_{unique}", str(tmp_path / "cp"))

    assert all(r["timestamp"] is not None for r in rows)
    got = sorted(({k: r[k] for k in expected[0]} for r in rows), key=_key)
    assert got == sorted(expected, key=_key)
    assert sum(1 for r in rows if r["value"] is None) == len([i for i in range(600) if i % 7 == 0])
    ran = [p["numInputRows"] for p in progress if p["numInputRows"]]
    assert len(ran) >= 6 and max(ran) <= 100 and sum(ran) == 600
    end = {topic: {"0": 200, "1": 200, "2": 200}}
    assert checkpoint_offsets(tmp_path / "cp") == end
    assert kafka.wait_group_offsets(group, end) == end


def test_transactional_offset_gaps_and_marker_only_ranges(spark, kafka, unique, tmp_path):
    """Commit markers take offsets; with a cap of 1 per partition some ranges hold only a marker."""
    topic = kafka.create_topic(f"txn_{unique}", partitions=2)
    p = kafka.producer(**{"transactional.id": f"tx_{unique}"})
    p.init_transactions(30)
    sent = []
    for txn in range(3):
        p.begin_transaction()
        for part in (0, 1):
            for j in range(2):
                key, value = f"t{txn}p{part}r{j}".encode(), f"value {txn}/{j}".encode()
                p.produce(topic, key=key, value=value, partition=part)
                sent.append((part, key, value))
        p.commit_transaction(30)
    # per partition: 2 records + 1 commit marker per transaction -> offsets 0..8, data at 0,1,3,4,6,7

    df = source(spark, kafka.bootstrap, topic, **{"max.records.per.batch": 2, "backfill": "capped"})
    rows, progress = run_available_now(spark, df, f"txn_{unique}", str(tmp_path / "cp"))

    got = sorted((r["partition"], r["key"], r["value"]) for r in rows)
    assert got == sorted(sent)  # every committed record exactly once
    assert sorted({r["offset"] for r in rows}) == [0, 1, 3, 4, 6, 7]
    assert checkpoint_offsets(tmp_path / "cp") == {topic: {"0": 9, "1": 9}}
    assert sum(1 for pr in progress if pr["numInputRows"] == 0 and "addBatch" in pr["durationMs"]) >= 1, \
        "expected at least one micro-batch whose ranges held only commit markers"


def test_new_partitions_are_picked_up_while_running(spark, kafka, unique, tmp_path):
    """The topic is recreated with more partitions while the query idles at offset 0 of partition 0
    (so partition 0's offsets stay valid). `test_partitions_added_with_create_partitions` grows a
    topic in place."""
    topic = kafka.create_topic(f"grow_{unique}", partitions=1)
    name = f"grow_{unique}"
    df = source(spark, kafka.bootstrap, topic, **{"max.records.per.batch": 1000})
    q = (df.writeStream.format("memory").queryName(name).option("checkpointLocation", str(tmp_path / "cp"))
         .trigger(processingTime="200 milliseconds").start())
    try:
        q.processAllAvailable()
        kafka.delete_topic(topic)
        kafka.create_topic(topic, partitions=3)
        sent = [(p, f"k{p}-{i}".encode(), f"v{i}".encode()) for p in range(3) for i in range(20)]
        kafka.produce(topic, sent)
        q.processAllAvailable()
        assert q.exception() is None
    finally:
        q.stop()
    rows = spark.table(name).toArrow().to_pylist()
    assert sorted((r["partition"], r["key"], r["value"]) for r in rows) == sorted(sent)
    assert checkpoint_offsets(tmp_path / "cp") == {topic: {"0": 20, "1": 20, "2": 20}}


def test_consumer_group_follows_every_batch_with_a_processing_time_trigger(spark, kafka, unique, tmp_path):
    topic = kafka.create_topic(f"group_{unique}", partitions=2)
    group = f"kappa.group_{unique}.v1"
    kafka.produce(topic, [(i % 2, f"k{i}".encode(), b"x") for i in range(300)])
    name = f"group_{unique}"
    df = source(spark, kafka.bootstrap, topic, **{"max.records.per.batch": 100, "group.id": group})
    q = (df.writeStream.format("memory").queryName(name).option("checkpointLocation", str(tmp_path / "cp"))
         .trigger(processingTime="200 milliseconds").start())
    try:
        q.processAllAvailable()
        first = kafka.wait_group_offsets(group, {topic: {"0": 150, "1": 150}})
        kafka.produce(topic, [(0, b"late", b"y")] * 5)
        q.processAllAvailable()
        second = kafka.wait_group_offsets(group, {topic: {"0": 155, "1": 150}})
        assert q.exception() is None
    finally:
        q.stop()
    assert first == {topic: {"0": 150, "1": 150}}
    assert second == {topic: {"0": 155, "1": 150}}
    assert spark.table(name).count() == 305


def test_offsets_the_broker_no_longer_has(spark, kafka, unique, tmp_path):
    """A checkpoint ahead of the log (the topic was recreated): a clear error by default; with
    on.missing.offsets=earliest the same checkpoint continues from the earliest offset.
    (A log start moved by DeleteRecords: `test_log_start_moved_past_the_checkpoint`.)"""
    topic = kafka.create_topic(f"gone_{unique}", partitions=1)
    kafka.produce(topic, [(0, f"old{i}".encode(), b"old") for i in range(8)])
    cp = str(tmp_path / "cp")
    rows, _ = run_available_now(spark, source(spark, kafka.bootstrap, topic), f"gone0_{unique}", cp,
                                parquet_dir=str(tmp_path / "out0"))
    assert len(rows) == 8

    kafka.delete_topic(topic)
    kafka.create_topic(topic, partitions=1)
    kafka.produce(topic, [(0, b"new0", b"new"), (0, b"new1", b"new")])

    q = (source(spark, kafka.bootstrap, topic).writeStream.format("parquet").option("path", str(tmp_path / "out1"))
         .option("checkpointLocation", cp).trigger(availableNow=True).start())
    text = str(await_failure(q))
    assert f"{topic}[0] next offset 8 > log end 2 (the topic was recreated or the log truncated)" in text
    assert "on.missing.offsets=earliest" in text
    assert read_parquet_rows(str(tmp_path / "out1")) == []
    assert checkpoint_offsets(cp) == {topic: {"0": 8}}  # nothing moved

    rows, _ = run_available_now(spark, source(spark, kafka.bootstrap, topic, **{"on.missing.offsets": "earliest"}),
                                f"gone2_{unique}", cp, parquet_dir=str(tmp_path / "out2"))
    assert sorted(r["key"] for r in rows) == [b"new0", b"new1"]
    assert checkpoint_offsets(cp) == {topic: {"0": 2}}


def test_bad_options_fail_the_query_with_the_option_named(spark, unique, kafka, tmp_path):
    q = None
    with pytest.raises(Exception, match="on.missing.offsets must be one of fail, earliest"):
        q = (source(spark, kafka.bootstrap, "t", **{"on.missing.offsets": "sometimes"})
             .writeStream.format("memory").queryName(f"bad_{unique}")
             .option("checkpointLocation", str(tmp_path / "cp")).start())
        raise await_failure(q)


def test_unknown_topic_is_a_clear_error(spark, kafka, unique, tmp_path):
    q = (source(spark, kafka.bootstrap, f"missing_{unique}").writeStream.format("memory")
         .queryName(f"missing_{unique}").option("checkpointLocation", str(tmp_path / "cp"))
         .trigger(availableNow=True).start())
    assert f"topic 'missing_{unique}' does not exist" in str(await_failure(q))


# --- transactions, DeleteRecords, CreatePartitions ------------------------------------------------

def test_aborted_transactions_never_reach_the_output(spark, kafka, unique, tmp_path):
    topic = kafka.create_topic(f"abort_{unique}", partitions=2)
    p = kafka.producer(**{"transactional.id": f"tx_{unique}"})
    p.init_transactions(30)
    committed = []
    for txn in range(4):
        p.begin_transaction()
        for part in (0, 1):
            key = f"t{txn}p{part}".encode()
            p.produce(topic, key=key, value=b"v", partition=part)
            if txn % 2 == 0:
                committed.append((part, key))
        if txn % 2 == 0:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    rows, _ = run_available_now(spark, source(spark, kafka.bootstrap, topic, **{"max.records.per.batch": 2}),
                                f"abort_{unique}", str(tmp_path / "cp"))
    assert sorted((r["partition"], r["key"]) for r in rows) == sorted(committed)


def test_log_start_moved_past_the_checkpoint(spark, kafka, unique, tmp_path):
    from confluent_kafka import TopicPartition

    topic = kafka.create_topic(f"retained_{unique}", partitions=1)
    kafka.produce(topic, [(0, f"a{i}".encode(), b"v") for i in range(5)])
    cp = str(tmp_path / "cp")
    run_available_now(spark, source(spark, kafka.bootstrap, topic), f"ret0_{unique}", cp,
                      parquet_dir=str(tmp_path / "out0"))
    kafka.produce(topic, [(0, f"b{i}".encode(), b"v") for i in range(10)])
    for f in kafka.admin.delete_records([TopicPartition(topic, 0, 12)]).values():
        f.result(timeout=30)
    q = (source(spark, kafka.bootstrap, topic).writeStream.format("parquet").option("path", str(tmp_path / "out1"))
         .option("checkpointLocation", cp).trigger(availableNow=True).start())
    assert f"{topic}[0] next offset 5 < log start 12 (7 offsets deleted" in str(await_failure(q))
    rows, _ = run_available_now(spark, source(spark, kafka.bootstrap, topic, **{"on.missing.offsets": "earliest"}),
                                f"ret2_{unique}", cp, parquet_dir=str(tmp_path / "out2"))
    assert sorted(r["offset"] for r in rows) == [12, 13, 14]


def test_partitions_added_with_create_partitions(spark, kafka, unique, tmp_path):
    from confluent_kafka.admin import NewPartitions

    topic = kafka.create_topic(f"addp_{unique}", partitions=1)
    kafka.produce(topic, [(0, b"a", b"1")])
    name = f"addp_{unique}"
    q = (source(spark, kafka.bootstrap, topic).writeStream.format("memory").queryName(name)
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="200 milliseconds").start())
    try:
        q.processAllAvailable()
        kafka.admin.create_partitions([NewPartitions(topic, 3)])[topic].result(timeout=30)
        kafka.wait_partitions(topic, 3)
        kafka.produce(topic, [(1, b"b", b"2"), (2, b"c", b"3")])
        deadline = time.monotonic() + WAIT_SECONDS
        while spark.table(name).count() < 3 and time.monotonic() < deadline:
            q.processAllAvailable()
        assert q.exception() is None
    finally:
        q.stop()
    assert sorted((r["partition"], r["key"]) for r in spark.table(name).toArrow().to_pylist()) == \
        [(0, b"a"), (1, b"b"), (2, b"c")]


def test_new_partition_with_a_moved_log_start_is_read_in_split_ranges(spark, kafka, unique, tmp_path):
    """issue 8 (d): a partition added while the query runs, whose log start is above 0 by then, is
    planned [0, end) and split; every piece reads from the log start (only the first did before)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import NewPartitions

    topic = kafka.create_topic(f"newlow_{unique}", partitions=1)
    kafka.produce(topic, [(0, b"a", b"1")])
    cp, opts = str(tmp_path / "cp"), {"minPartitions": 4, "splitMinRecords": 1}
    run_available_now(spark, source(spark, kafka.bootstrap, topic, **opts), f"newlow0_{unique}", cp,
                      parquet_dir=str(tmp_path / "out0"))
    kafka.admin.create_partitions([NewPartitions(topic, 2)])[topic].result(timeout=30)
    kafka.wait_partitions(topic, 2)
    kafka.produce(topic, [(1, f"b{i}".encode(), b"v") for i in range(40)])
    for f in kafka.admin.delete_records([TopicPartition(topic, 1, 30)]).values():
        f.result(timeout=30)
    rows, _ = run_available_now(spark, source(spark, kafka.bootstrap, topic, **opts), f"newlow1_{unique}", cp,
                                parquet_dir=str(tmp_path / "out1"))
    assert sorted(r["offset"] for r in rows if r["partition"] == 1) == list(range(30, 40))
