"""Issue 8, item 1 on a Spark standalone cluster: the records go through tasks on the executors.

A master and two workers of one core each on 127.0.0.1; a client-mode driver (a process of its
own, `std_cluster.py`, since this test session may hold the shared local SparkContext) runs the
standardize job's own `start_query` available-now over a 4-partition changelog, split into
several offset ranges per partition. Spark's REST API (`/applications/<id>/stages`, `/executors`)
then tells which executor ran every task and how many bytes each task handed back to the driver.

The test holds:
- the output table equals the oracle's expected table, the rejects equal the expected rejects;
- the read-transform-stage tasks and the merge tasks ran on both executors, none on the driver,
  one read task per planned range, the buckets merged in the tasks the job planned;
- the driver never holds a batch: the foreachBatch collected only offset-range rows (which cover
  the log exactly), and all task results of the application together are under 1% of the log's
  key and value bytes.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from std_cluster import Cluster, run_driver
from std_helpers import V2, JobPaths, bucket_layout_diff

from jobs.lib.delta_sink import read_table
from orchestrator.dev.datagen import ensure_topic, generate_changelog, iter_log, produce
from tests.oracle.standardize import OUTPUT_SCHEMA, expected_table

pytestmark = pytest.mark.integration

RECORDS, KEYS, VALUE_SIZE = 60_000, 6_000, 400
PARTITIONS, EXECUTORS = 4, 2
TASK_RECORDS = 4_000        # about 4 ranges per partition: several read tasks per executor
BUCKETS = 8
RANGE_ROW = "str,int,int,int,bool"


@pytest.fixture
def cluster(tmp_path):
    """A standalone master and EXECUTORS workers of 1 core each, stopped by their PIDs."""
    c = Cluster(tmp_path / "spark-cluster", EXECUTORS, cores=1, memory="1g")
    try:
        yield c.start()
    finally:
        c.stop()


def _stage_tasks(result: dict, prefix: str) -> tuple[list[dict], list[dict]]:
    stages = [s for s in result["stages"] if s["description"].startswith(prefix)]
    return stages, [t for s in stages for t in s["tasks"]]


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
    args["extra"] = {"max_records_per_task": TASK_RECORDS, "buckets": BUCKETS}
    driver_dir = tmp_path / "driver"
    driver_dir.mkdir()
    result, text = run_driver({"master": cluster.url, "executors": EXECUTORS, "bootstrap": bootstrap, "topic": topic,
                               "rules": str(V2.path), "args": args, "local_dir": str(driver_dir / "spark-local"),
                               "ui_port": 0}, driver_dir)
    assert result is not None, text

    # the output: exactly the oracle's table and rejects
    expected = expected_table(log, "v2")
    out = read_table(paths.output).sort_by("member_id")
    assert bucket_layout_diff(paths.output, out) is None
    out = out.drop_columns(["key_bucket"])
    assert out.schema.equals(OUTPUT_SCHEMA)
    assert out.equals(expected.table)
    rejects = read_table(paths.rejects).to_pylist()
    assert sorted((r["partition"], r["offset"], r["error"]) for r in rejects) == sorted(expected.rejects)

    # the foreachBatch collected offset ranges, not records: one backfill batch whose ranges cover the log
    assert [c["types"] for c in result["collected"]] == [[RANGE_ROW]]
    pieces = [r for r in result["collected"][0]["rows"] if r[3] > r[2]]
    for p, count in per_partition.items():
        spans = sorted((start, end) for t, part, start, end, _new in pieces if (t, part) == (topic, p))
        assert spans[0][0] == 0 and spans[-1][1] == count
        assert all(a[1] == b[0] and b[1] - b[0] <= TASK_RECORDS for a, b in zip(spans, spans[1:]))
    assert len(pieces) == sum(math.ceil(n / TASK_RECORDS) for n in per_partition.values()) >= 4 * EXECUTORS
    assert result["skipped"] == [] and [(t["rows_in"], t["tasks"], t["buckets"]) for t in result["timings"]] == [
        (RECORDS, len(pieces), BUCKETS)]

    # Spark's task metrics by executor: read-transform and merge tasks on both executors, none on the driver
    executors = {e["id"]: e for e in result["executors"]}
    workers = sorted(set(executors) - {"driver"})
    assert len(workers) == EXECUTORS and executors["driver"]["total_tasks"] == 0, executors
    read_stages, read = _stage_tasks(result, "kappa read+transform")
    merge_stages, merge = _stage_tasks(result, "kappa merge")
    assert {s["status"] for s in read_stages + merge_stages} == {"COMPLETE"}
    assert {t["status"] for t in read + merge} == {"SUCCESS"}
    assert len(read) == len(pieces) and len(merge) == result["timings"][0]["merge_tasks"] >= 2
    by_read, by_merge = Counter(t["executor"] for t in read), Counter(t["executor"] for t in merge)
    print(f"read+transform tasks by executor {dict(by_read)}, merge tasks {dict(by_merge)}")
    assert sorted(by_read) == workers and min(by_read.values()) >= 2, by_read
    assert sorted(by_merge) == workers, by_merge

    # the driver never holds a batch: every task result of the application, ranges included, is small
    handed_back = sum(t["result_size"] for s in result["stages"] for t in s["tasks"])
    kappa_back = sum(t["result_size"] for t in read + merge)
    print(f"log {log_bytes} B of keys and values; task results to the driver {handed_back} B "
          f"({handed_back / log_bytes:.3%}), of which read+transform and merge tasks {kappa_back} B")
    assert 0 < kappa_back <= handed_back < log_bytes / 100
