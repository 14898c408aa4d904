"""The job's tables take their locations as URIs (`file:///...`, `s3a://...`) as well as paths: the
rejects table a first batch with no rejects creates empty is created at a `file://` URI too (Delta
qualifies `file:///x` to `file:/x` and refused the two as different locations)."""

from __future__ import annotations

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
