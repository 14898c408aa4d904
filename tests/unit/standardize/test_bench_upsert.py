"""`kappa bench upsert` at a tiny size: its figures add up and the micro-batch touched what it changed."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from orchestrator.cli import app


def test_bench_upsert_reports_the_live_batch_next_to_a_full_rewrite(tmp_path):
    out = tmp_path / "upsert.json"
    result = CliRunner().invoke(app, ["bench", "upsert", "--rows", "3000", "--changed", "5", "--buckets", "64",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert (figures["rows"], figures["changed"], figures["buckets"]) == (3000, 5, 64)
    live, full = figures["live"], figures["full_rewrite"]
    assert 1 <= live["buckets"] <= 5 and full["buckets"] == 64          # 5 keys touch at most 5 buckets
    assert 0 < live["bytes_rewritten"] < full["bytes_written"]
    assert figures["ratio_bytes"] == live["bytes_written"] / full["bytes_written"] < 0.2
    assert "full rewrite (reference)" in result.output


def test_bench_upsert_refuses_a_bad_bucket_count():
    result = CliRunner().invoke(app, ["bench", "upsert", "--buckets", "0"])
    assert result.exit_code == 2 and "--buckets" in result.output
