"""`kappa bench upsert` at a small size: its figures add up and the micro-batch marked rows instead of
rewriting the table."""

from __future__ import annotations

import pytest

from orchestrator.dev.upsertbench import run_upsert_bench

pytestmark = pytest.mark.integration


def test_bench_upsert_reports_the_live_batches_next_to_a_full_rewrite(spark, tmp_path):
    figures = run_upsert_bench(20_000, 5, batches=2, workdir=tmp_path, spark=spark)
    assert (figures["rows"], figures["changed"], figures["batches"]) == (20_000, 5, 2)
    full = figures["full_rewrite"]
    for live in figures["live"]:
        assert live["rows_updated"] == 5 and live["deletion_vectors_added"] >= 1 and live["files_rewritten"] == 0
        assert 1 <= live["files_touched"] <= live["files_in_table"] and live["spark_jobs"] >= 1
        assert live["executor_cpu_seconds"] > 0 and 0 < live["bytes_written"] < full["bytes_written"]
    assert figures["first"] == figures["live"][0] and figures["steady"]["seconds"] == figures["live"][1]["seconds"]
    assert figures["ratio_bytes"] == figures["steady"]["bytes_written"] / full["bytes_written"]
    # the reference: Delta's plain MERGE of the same keys into a copy of the same table, ending equal to kappa's
    for ref in figures["plain"]:
        assert ref["rows_updated"] == 5 and ref["spark_jobs"] >= 1 and ref["executor_cpu_seconds"] > 0
    assert figures["ratio_plain"] == figures["plain_steady"]["seconds"] / figures["steady"]["seconds"]
    table = lambda name: sorted(tuple(r) for r in spark.read.format("delta").load(str(tmp_path / name)).collect())
    assert table("plain") == table("out")


def test_bench_upsert_refuses_a_bad_count():
    from typer.testing import CliRunner

    from orchestrator.cli import app

    result = CliRunner().invoke(app, ["bench", "upsert", "--changed", "0"])
    assert result.exit_code == 2 and "--changed" in result.output


def test_a_small_batch_merged_from_the_driver_updates_keys_with_quotes_backslashes_and_nulls(spark, tmp_path):
    """The batch's keys become SQL literals in the MERGE's condition on the table: keys that need escaping
    are updated in place (no second row), a null key too, a tombstone deletes."""
    from jobs.lib.sink.tables import DeltaTables

    schema = "k string, v string, source_partition int, source_offset long, source_timestamp timestamp, _deleted boolean"
    keys = ["o'b", "c\\d", "plain", None, "gone"]
    tables = DeltaTables(str(tmp_path / "t"), None, "kappa.test.v1", "k")
    tables.upsert(0, spark.createDataFrame([(k, "old", 0, i, None, False) for i, k in enumerate(keys)], schema), "_deleted",
                  rows=len(keys))
    batch = [("o'b", "new", 0, 10, None, False), ("c\\d", "new", 0, 11, None, False), (None, "new", 0, 12, None, False),
             ("gone", None, 0, 13, None, True), ("fresh", "new", 0, 14, None, False)]
    tables.upsert(1, spark.createDataFrame(batch, schema), "_deleted", rows=len(batch))
    got = sorted((r["k"] or "", r["v"]) for r in spark.read.format("delta").load(str(tmp_path / "t")).collect())
    assert got == [("", "new"), ("c\\d", "new"), ("fresh", "new"), ("o'b", "new"), ("plain", "old")]
