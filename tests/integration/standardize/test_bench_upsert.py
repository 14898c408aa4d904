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


def test_bench_upsert_refuses_a_bad_count():
    from typer.testing import CliRunner

    from orchestrator.cli import app

    result = CliRunner().invoke(app, ["bench", "upsert", "--changed", "0"])
    assert result.exit_code == 2 and "--changed" in result.output
