"""`run_reprocess_bench` end to end on a small log, in its own process (it starts and stops its own
Spark session) on the session's broker. The bench's own figures are not the evidence: the test
keeps the bench's output and rejects tables and compares them with the tests' oracle itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jobs.lib.delta_sink import read_table
from orchestrator.dev.datagen import iter_log
from tests.oracle.standardize import OUTPUT_SCHEMA, expected_table

pytestmark = pytest.mark.integration


def test_reprocess_bench_small(tmp_path, bootstrap, seed):
    from jobs.lib.session import spark_env

    out, work = tmp_path / "bench.json", tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.dev.bench", "--records", "30000", "--keys", "8000",
         "--max-records-per-batch", "10000", "--malformed-share", "0.01", "--seed", str(seed),
         "--bootstrap", bootstrap, "--workdir", str(work), "--json", str(out)],
        env={**os.environ, **spark_env(), "COLUMNS": "160"}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(out.read_text())

    # the evidence: the kept tables against the oracle, computed here from the topic the bench filled
    log = list(iter_log(bootstrap, figures["topic"]))
    assert len(log) == 30000
    expected = expected_table(log, "v2")
    output = read_table(work / "out").sort_by("member_id")
    assert output.schema.equals(OUTPUT_SCHEMA)
    assert output.equals(expected.table)
    rejects = read_table(work / "out__rejects").to_pylist()
    assert sorted((r["partition"], r["offset"], r["error"]) for r in rejects) == sorted(expected.rejects)
    assert len(expected.rejects) > 100

    # the bench's own figures agree with that
    check = figures["check"]
    assert (check["raw_columns_match"], check["rejects_match"]) == (True, True)
    assert (check["rows"], check["expected_rows"]) == (output.num_rows, expected.table.num_rows)
    assert check["rejects"] == check["expected_rejects"] == figures["reprocess"]["rejects"] == len(expected.rejects)
    assert figures["raw_consumer"]["records"] == figures["reprocess"]["records"] == 30000
    assert figures["produce"]["singles"] == 4
    assert figures["reprocess"]["batches"] >= 3
    for key in ("records_per_s", "mb_per_s"):
        assert figures["reprocess"][key] > 0 and figures["raw_consumer"][key] > 0
    assert figures["spark_startup_seconds"] > 0 and figures["peak_memory_mb"] > 0
    assert "kappa bench reprocess" in proc.stdout
    assert "output's raw columns match the generated records: yes" in proc.stdout
    assert "rejects match the malformed records: yes" in proc.stdout
    assert "tansu" in proc.stdout  # the printed note on the last record of each partition
