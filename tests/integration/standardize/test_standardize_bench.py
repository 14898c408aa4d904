"""`run_reprocess_bench` end to end on a small log, in its own process (it starts and stops its own
broker and Spark session)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_reprocess_bench_small(tmp_path):
    from jobs.lib.session import spark_env

    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.dev.bench", "--records", "30000", "--keys", "8000",
         "--max-records-per-batch", "10000", "--malformed-share", "0.01", "--json", str(out)],
        env={**os.environ, **spark_env(), "COLUMNS": "160"}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["output_matches"] is True and figures["rejects_match"] is True
    assert figures["raw_consumer"]["records"] == figures["reprocess"]["records"] == 30000
    assert figures["produce"]["singles"] == 4
    assert figures["reprocess"]["batches"] >= 3
    assert figures["reprocess"]["rejects"] > 0
    for key in ("records_per_s", "mb_per_s"):
        assert figures["reprocess"][key] > 0 and figures["raw_consumer"][key] > 0
    assert figures["spark_startup_seconds"] > 0 and figures["peak_memory_mb"] > 0
    assert "kappa bench reprocess" in proc.stdout
    assert "output matches the expected table: yes" in proc.stdout
    assert "tansu" in proc.stdout  # the printed note on the last record of each partition
