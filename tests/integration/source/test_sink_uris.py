"""The job's tables take their locations as URIs (`file:///...`, `s3a://...`) as well as paths: the
rejects table a first batch with no rejects creates empty is created at a `file://` URI too (Delta
qualifies `file:///x` to `file:/x` and refused the two as different locations)."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from jobs.lib.sink.tables import DeltaTables


def test_an_empty_rejects_table_is_created_at_a_file_uri(spark, tmp_path):
    rejects_uri = f"file://{tmp_path}/warehouse/v1__rejects"
    tables = DeltaTables(f"file://{tmp_path}/warehouse/v1", rejects_uri, "app", "member_id")
    empty = spark.createDataFrame([], "member_id string, reason string")

    tables.write_rejects(0, empty, 0)
    tables.write_rejects(1, empty, 0)       # exists now: nothing more to commit

    assert DeltaTable(rejects_uri).version() == 0
    table = spark.read.format("delta").load(rejects_uri)
    assert table.columns == ["member_id", "reason"]
    assert table.count() == 0


@pytest.mark.parametrize("left", [
    {"00000000000000000000.json": b""},                                        # an empty commit file
    {".00000000000000000000.json.5f1c.tmp": b'{"commitInfo":{"ti',            # Delta's temp file, never renamed
     "..00000000000000000000.json.5f1c.tmp.crc": b""},
])
def test_a_rejects_table_whose_create_a_full_disk_cut_short_is_created_again(spark, tmp_path, left):
    """The disk filled while the first batch created the empty rejects table (Delta's log store failed to
    close its temp file, so nothing was renamed into the log). The job restarted from its checkpoint must
    create the table, not fail on a table Delta cannot find (DELTA_TABLE_NOT_FOUND: found by the fault
    suite's disk-full scenario); a log with a commit is never touched (below)."""
    rejects_uri = f"file://{tmp_path}/warehouse/v1__rejects"
    torn = tmp_path / "warehouse" / "v1__rejects" / "_delta_log"
    torn.mkdir(parents=True)
    for name, data in left.items():
        (torn / name).write_bytes(data)
    tables = DeltaTables(f"file://{tmp_path}/warehouse/v1", rejects_uri, "app", "member_id")
    empty = spark.createDataFrame([], "member_id string, reason string")

    tables.write_rejects(0, empty, 0)

    assert DeltaTable(rejects_uri).version() == 0
    assert spark.read.format("delta").load(rejects_uri).count() == 0


def test_a_log_with_a_commit_is_never_cleared(spark, tmp_path):
    from jobs.lib.sink.tables import clear_torn_create

    table = f"file://{tmp_path}/t"
    spark.createDataFrame([("m1", "x")], "member_id string, reason string").write.format("delta").save(table)
    assert clear_torn_create(spark, table) is False
    assert DeltaTable(table).version() == 0
    assert clear_torn_create(spark, f"file://{tmp_path}/nothing-here") is False


def test_an_empty_rejects_table_has_the_schema_a_write_of_rejects_gives_it(spark, tmp_path):
    """Found by the fault suite, with a seed whose backfill had no reject: the rejects table a first batch
    without rejects creates took the batch's schema as it was, its ``batch_id`` (a literal) NOT NULL,
    where a write of rejects makes every column nullable. One table's schema hung on the data's chance
    (and the oracle refused it: "batch_id is int64 not null")."""
    from pyspark.sql import functions as F

    from orchestrator.core.tables import read_table
    from tests.served import REJECTS_SCHEMA

    def rejects(rows: list) -> object:   # the job's rejects: the source's columns, the reason, the batch id
        return (spark.createDataFrame(rows, "key binary, value binary, topic string, partition int, offset bigint, "
                                            "error string").withColumn("batch_id", F.lit(0).cast("long")))

    assert not rejects([]).schema["batch_id"].nullable
    empty, written = f"{tmp_path}/empty__rejects", f"{tmp_path}/written__rejects"
    DeltaTables(f"{tmp_path}/empty", empty, "app", "member_id").write_rejects(0, rejects([]), 0)
    DeltaTables(f"{tmp_path}/written", written, "app", "member_id").write_rejects(
        0, rejects([(b"m1", b"{", "t", 0, 7, "invalid JSON")]), 1)

    assert DeltaTable(empty).version() == 0 and read_table(empty).num_rows == 0
    assert read_table(empty).schema == read_table(written).schema == REJECTS_SCHEMA
