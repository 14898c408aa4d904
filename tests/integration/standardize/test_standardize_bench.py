"""The benchmarks end to end at tiny sizes, each in its own process as a user runs it. Their figures
are not asserted as numbers (no timed asserts): the tests check the output's structure, that the
reprocess's output is right (against the tests' own oracle, not the bench's self-check), and that
every process a benchmark started is gone afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from orchestrator.dev.datagen import iter_log
from orchestrator.jobctl.process import create_time
from tests.oracle.standardize import OUTPUT_SCHEMA, expected_table
from orchestrator.core.tables import read_table

pytestmark = pytest.mark.integration


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    from jobs.lib.runtime.session import spark_env

    proc = subprocess.run([sys.executable, *argv], env={**os.environ, **spark_env(), "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _all_gone(pids: list[int], since: float) -> list[int]:
    """The PIDs still held by a process created before `since` (so, not a later reuse)."""
    left = []
    for pid in pids:
        created = create_time(pid)
        if created is not None and created < since:
            left.append(pid)
    return left


def _read(uri):
    return read_table(str(uri))


def test_reprocess_bench_small(tmp_path, bootstrap, seed):
    out, work = tmp_path / "bench.json", tmp_path / "work"
    started = time.time()
    proc = _run(["-m", "orchestrator.dev.bench", "--records", "30000", "--keys", "8000",
                 "--max-records-per-batch", "10000", "--malformed-share", "0.01", "--seed", str(seed),
                 "--bootstrap", bootstrap, "--workdir", str(work), "--json", str(out)], 900)
    figures = json.loads(out.read_text())

    # the evidence: the kept tables against the oracle, computed here from the topic the bench filled
    log = list(iter_log(bootstrap, figures["topic"]))
    assert len(log) == 30000
    expected = expected_table(log, "v2")
    output = _read(work / "out").select(OUTPUT_SCHEMA.names).sort_by("member_id")
    assert output.schema.equals(OUTPUT_SCHEMA)
    assert output.equals(expected.table)
    rejects = _read(work / "out__rejects").to_pylist()
    assert sorted((r["partition"], r["offset"], r["error"]) for r in rejects) == sorted(expected.rejects)
    assert len(expected.rejects) > 100

    # the bench's own figures agree with that
    check = figures["check"]
    assert (check["raw_columns_match"], check["rejects_match"]) == (True, True)
    assert (check["rows"], check["expected_rows"]) == (output.num_rows, expected.table.num_rows)
    assert check["rejects"] == check["expected_rejects"] == figures["reprocess"]["rejects"] == len(expected.rejects)
    ref = figures["reference"]
    assert ref["records"] == figures["raw_consumer"]["records"] == figures["reprocess"]["records"] == 30000
    assert ref["processes"] == min(4, os.cpu_count() or 1) == len(ref["per_process"])
    assert sorted(p for r in ref["per_process"] for p in r["partitions"]) == [0, 1, 2, 3]
    assert sum(r["records"] for r in ref["per_process"]) == 30000
    perf = figures["consumer_performance"]
    assert perf["records"] == 30000 and perf["records_per_s"] > 0 and figures["ratio_to_consumer_performance"] > 0
    assert figures["reprocess"]["batches"] >= 1
    for key in ("records_per_s", "mb_per_s"):
        assert figures["reprocess"][key] > 0 and ref[key] > 0
    assert figures["ratio_to_reference"] > 0 and figures["ratio_to_one_consumer"] > 0
    b = figures["time_breakdown_seconds"]
    assert b["spark_startup"] > 0 and b["spark_addBatch"] > 0 and b["query_start_to_first_batch"] >= 0
    assert figures["spark_startup_seconds"] > 0 and figures["peak_memory_mb"] > 0
    # CPU seconds beside wall time, and the plain Spark pipeline measured in the same run
    assert figures["executor"]["cpu_seconds"] > 0 and figures["process_cpu_seconds"] >= figures["executor"]["cpu_seconds"]
    assert figures["spark_jobs"] >= 2
    plain = figures["plain_spark"]
    # it keeps a malformed latest record as a row of nulls where kappa keeps the member's last valid value
    assert abs(plain["rows"] - output.num_rows) <= len(expected.rejects) and plain["records_per_s"] > 0 and plain["executor"]["cpu_seconds"] > 0
    assert figures["ratio_to_plain_spark"] == round(figures["reprocess"]["records_per_s"] / plain["records_per_s"], 3)
    assert plain["query_start_to_first_batch"] >= plain["until_first_trigger"] > 0
    for text in ("plain Spark pipeline", "ratio to the plain Spark pipeline", "CPU: executor CPU",
                 "costliest stages", "kappa bench reprocess", "raw read (reference)", "ratio to the reference", "where the time goes",
                 "peak memory", "output's raw columns match the generated records: yes",
                 "rejects match the malformed records: yes", "Kafka ConsumerPerformance",
                 "ratio to Kafka's ConsumerPerformance", "micro-batch 0:"):
        assert text in proc.stdout, text
    # the reference processes, the reprocess's and the plain pipeline's (and their JVMs, by process group) are gone
    assert len(figures["pids_started"]) == ref["processes"] + 2
    assert _all_gone(figures["pids_started"], started) == []
