"""The standardize job on a Spark standalone cluster: the records are read, transformed and written
by tasks on the executors.

A master and two workers of one core each on 127.0.0.1; a client-mode driver (a process of its
own, `std_cluster.py`, since this test session may hold the shared local SparkContext) runs the
standardize job's own `start_query` available-now over a 4-partition changelog; Spark's Kafka
source splits the backfill into ``minPartitions`` tasks. Spark's REST API (`/applications/<id>/stages`,
`/executors`) then tells which executor ran every task, what it read and wrote, and how many bytes
each task handed back to the driver.

The test holds:
- the output table equals the oracle's expected table, the rejects equal the expected rejects;
- the Kafka scan's tasks ran on both executors and read every record once between them, the Delta
  writes' tasks wrote on both executors, none ran on the driver;
- the driver never holds a batch: every task result is under 64 KiB and under 2% of a scan task's
  share of the log (a result carries the task's metrics, a few KB, not records).
"""

from __future__ import annotations

from collections import Counter

import pytest
from std_cluster import Cluster, run_driver
from std_helpers import V2, JobPaths

from orchestrator.core.tables import read_table
from orchestrator.dev.datagen import ensure_topic, generate_changelog, iter_log, produce
from tests.oracle.standardize import OUTPUT_SCHEMA, expected_table

pytestmark = pytest.mark.integration

RECORDS, KEYS, VALUE_SIZE = 30_000, 3_000, 400
PARTITIONS, EXECUTORS = 4, 2
MIN_PARTITIONS = 8         # Spark's Kafka source splits the backfill into 8 tasks: several per executor


@pytest.fixture
def cluster(tmp_path):
    """A standalone master and EXECUTORS workers of 1 core each, stopped by their PIDs."""
    c = Cluster(tmp_path / "spark-cluster", EXECUTORS, cores=1, memory="1g")
    try:
        yield c.start()
    finally:
        c.stop()


def test_records_are_read_transformed_and_written_on_both_executors(bootstrap, unique, seed, tmp_path, cluster):
    topic = f"profiles_cluster_{unique}"
    ensure_topic(bootstrap, topic, partitions=PARTITIONS)
    produce(bootstrap, topic, generate_changelog(RECORDS, KEYS, seed=seed, malformed_share=0.04, delete_share=0.06,
                                                 value_size=VALUE_SIZE), batching=True)
    log = list(iter_log(bootstrap, topic))
    assert len(log) == RECORDS
    log_bytes = sum(len(r.key or b"") + len(r.value or b"") for r in log)
    per_partition = Counter(r.partition for r in log)
    assert len(per_partition) == PARTITIONS

    paths = JobPaths(tmp_path / "job")
    args = vars(paths.args(bootstrap, topic, V2.path))
    driver_dir = tmp_path / "driver"
    driver_dir.mkdir()
    result, text = run_driver({"master": cluster.url, "executors": EXECUTORS, "bootstrap": bootstrap, "topic": topic,
                               "rules": str(V2.path), "args": args, "local_dir": str(driver_dir / "spark-local"),
                               "ui_port": 0, "min_partitions": MIN_PARTITIONS}, driver_dir)
    assert result is not None, text

    # the output: exactly the oracle's table and rejects
    expected = expected_table(log, "v2")
    out = read_table(paths.output).sort_by("member_id")
    assert out.schema.equals(OUTPUT_SCHEMA)
    assert out.equals(expected.table)
    rejects = read_table(paths.rejects).to_pylist()
    assert sorted((r["partition"], r["offset"], r["error"]) for r in rejects) == sorted(expected.rejects)
    assert result["skipped"] == [] and [t["batch_id"] for t in result["timings"]] == [0]   # one backfill batch

    # Spark's task metrics by executor: the scan read on both executors, the writes wrote on both
    executors = {e["id"]: e for e in result["executors"]}
    workers = sorted(set(executors) - {"driver"})
    assert len(workers) == EXECUTORS and executors["driver"]["total_tasks"] == 0, executors
    batch = [s for s in result["stages"] if s["description"].startswith("kappa standardize: micro-batch 0")]
    assert batch and {s["status"] for s in batch} <= {"COMPLETE", "SKIPPED"}
    scan = min(batch, key=lambda s: s["id"])          # the batch's first job's first stage reads Kafka
    assert len(scan["tasks"]) >= MIN_PARTITIONS and {t["status"] for t in scan["tasks"]} == {"SUCCESS"}
    read = Counter()
    for t in scan["tasks"]:
        read[t["executor"]] += t["records_read"]
    wrote = Counter()
    for s in batch:
        for t in s["tasks"]:
            wrote[t["executor"]] += t["bytes_written"]
    print(f"records read by executor {dict(read)}, bytes written by executor {dict(wrote)}")
    # every record read once between them (Spark's recordsRead counts one more row per scan task here)
    assert sorted(read) == workers and min(read.values()) > 0, read
    assert RECORDS <= sum(read.values()) <= RECORDS + len(scan["tasks"]), read
    assert sorted(e for e, b in wrote.items() if b > 0) == workers, wrote

    # the driver never holds a batch: every task result of the application is small. A result carries
    # the task's metrics (5 to 7 KB a task for this plan's SQL metrics, whatever the data), so the
    # bound is per task: a task that returned its share of the records (~5 MB) would be far over it
    sizes = [t["result_size"] for s in result["stages"] for t in s["tasks"]]
    handed_back, biggest = sum(sizes), max(sizes)
    print(f"log {log_bytes} B of keys and values; task results to the driver {handed_back} B "
          f"({handed_back / log_bytes:.3%}) from {len(sizes)} tasks, the biggest {biggest} B")
    assert 0 < biggest < min(64 * 1024, log_bytes / len(scan["tasks"]) / 50)
