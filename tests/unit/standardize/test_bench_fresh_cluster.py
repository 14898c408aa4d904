"""`kappa bench freshness` and `kappa bench cluster`: their pure parts and their refusals of bad
arguments (one line, exit 1, before anything starts). No services."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from orchestrator.core.exceptions import ConfigError, LifecycleError
from orchestrator.dev.bench import validate_sizes
from orchestrator.dev.clusterbench import cluster_lines, scaling_rows, validate_cluster
from orchestrator.dev.freshbench import (Probes, freshness_figures, freshness_lines, trigger_interval,
                                         validate_freshness)


def test_probes_measure_from_send_to_first_read_of_the_same_value():
    p = Probes()
    p.sent("m1", "probe-a", at=10.0)
    p.sent("m2", "probe-b", at=10.5)
    assert p.seen({"m1": "an older value", "m2": None}, at=11.0) == 0   # not this probe's value yet
    assert p.seen({"m1": "probe-a"}, at=11.2) == 1
    assert p.seen({"m1": "probe-a"}, at=12.0) == 0                      # counted once
    p.sent("m2", "probe-c", at=11.5)                                    # overwrites probe-b unseen
    assert p.seen({"m2": "probe-b"}, at=11.6) == 0
    assert p.seen({"m2": "probe-c"}, at=12.5) == 1
    assert p.latencies == pytest.approx([1.2, 1.0])
    assert (p.produced, p.superseded, p.pending) == (3, 1, {})


def test_freshness_figures_and_lines():
    f = freshness_figures([0.8, 1.0, 1.2, 1.4, 3.0], produced=7, superseded=1, unseen=1, interval=1.0, poll=0.05)
    assert (f["p50_seconds"], f["p99_seconds"], f["max_seconds"]) == (1.2, 2.936, 3.0)
    assert (f["readable"], f["p50_to_interval"], f["p99_to_interval"]) == (5, 1.2, 2.94)
    lines = freshness_lines(f)
    assert lines[0] == ("freshness, produce -> readable through the alias: p50 1.20 s, p99 2.94 s, max 3.00 s over "
                        "5 records (of 7 produced; 1 superseded before readable, 1 never seen)")
    assert lines[1].startswith("reference: the job's trigger interval 1.00 s; p50 = 1.20 x interval, p99 = 2.94")
    assert len(lines) == 2
    f.update(live_seconds=30.04, job_process_cpu_seconds=21.5, spark_jobs_per_batch={"batches": 12, "median": 11, "max": 14},
             executor={"cpu_seconds": 9.25, "run_seconds": 20.0, "gc_seconds": 0.1, "stages": 90, "top": []})
    assert freshness_lines(f)[2] == ("CPU over the 30.0 s of live updates: the job's executor CPU 9.2 s (Spark's event "
                                     "log), its processes 21.5 s; 12 micro-batches, 11 Spark jobs each (median; at most 14)")
    empty = freshness_figures([], produced=3, superseded=0, unseen=3, interval=1.0, poll=0.05)
    assert empty["p50_seconds"] is None and len(freshness_lines(empty)) == 1


def test_trigger_interval_is_read_from_the_job_command():
    assert trigger_interval(["python", "-m", "jobs.standardize", "--trigger", "continuous",
                             "--interval-seconds", "2.5"]) == 2.5
    assert trigger_interval(["python", "-m", "jobs.standardize", "--trigger", "continuous"]) == 1.0  # runtime default
    with pytest.raises(LifecycleError, match="available-now trigger, not a live one"):
        trigger_interval(["--trigger", "available-now"])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"seconds": 0}, "--seconds must be a positive number, got 0"),
    ({"rate": -1.0}, "--rate must be a positive number, got -1.0"),
    ({"rate": 10_000}, "--rate 10000 is above 5000 updates/s"),
    ({"poll": 0.0}, "--poll must be a positive number"),
    ({"keys": 200, "records": 100}, "--keys must be between 1 and --records"),
])
def test_freshness_arguments_are_refused_with_one_line(kwargs, message):
    args = {"seconds": 10.0, "rate": 20.0, "poll": 0.05, "drain": 30.0, "records": 1000, "keys": 100, **kwargs}
    with pytest.raises(ConfigError, match=message) as e:
        validate_freshness(**args)
    assert "\n" not in str(e.value)


def test_reprocess_and_cluster_sizes_are_refused_with_one_line():
    with pytest.raises(ConfigError, match=r"--keys \(500,000\) cannot exceed --records \(1,000\)"):
        validate_sizes(1000, 500_000, 4)
    with pytest.raises(ConfigError, match="--value-size must be an integer of at least 50, got 10"):
        validate_sizes(1000, 10, 4, 10)
    with pytest.raises(ConfigError, match="--partitions must be at least 2 .one per worker., got 1"):
        validate_cluster([1000], 1, 100, 200)
    with pytest.raises(ConfigError, match="--sizes names no log size"):
        validate_cluster([], 4, 100, 200)


RUNS = [{"size": 1_000_000, "workers": 1, "records_per_s": 100_000, "driver_peak_mb": 900},
        {"size": 1_000_000, "workers": 2, "records_per_s": 180_000, "driver_peak_mb": 950},
        {"size": 4_000_000, "workers": 1, "records_per_s": 110_000, "driver_peak_mb": 1000},
        {"size": 4_000_000, "workers": 2, "records_per_s": 170_500, "driver_peak_mb": 2000}]


def test_scaling_rows_and_lines():
    rows = scaling_rows(RUNS)
    assert rows == [
        {"size": 1_000_000, "records_per_s": {1: 100_000, 2: 180_000}, "seconds": {1: None, 2: None},
         "executor_cpu_seconds": {1: None, 2: None}, "driver_peak_mb": {1: 900, 2: 950}, "ratio": 1.8},
        {"size": 4_000_000, "records_per_s": {1: 110_000, 2: 170_500}, "seconds": {1: None, 2: None},
         "executor_cpu_seconds": {1: None, 2: None}, "driver_peak_mb": {1: 1000, 2: 2000}, "ratio": 1.55}]
    lines = cluster_lines({"scaling": rows})
    assert lines[0] == ("1,000,000 records: 1 worker 100,000 records/s, 2 workers 180,000 records/s; ratio 1.80 "
                        "(goal met: >= 1.7); driver peak memory 900 MB with 1, 950 MB with 2")
    assert "ratio 1.55 (goal NOT met: >= 1.7)" in lines[1]
    assert lines[3] == ("driver peak memory with 2 workers: 950 MB at 1,000,000 records, 2,000 MB at 4,000,000 "
                        "records (x2.11 for x4.0 the records)")
    timed = scaling_rows([{**r, "seconds": 10.0 * r["workers"], "executor_cpu_seconds": 8.25} for r in RUNS])
    assert cluster_lines({"scaling": timed})[0].endswith(
        "; 10.0 s wall / 8.2 s executor CPU with 1, 20.0 s wall / 8.2 s executor CPU with 2")
    one = scaling_rows([RUNS[0]])
    assert one[0]["ratio"] is None and "ratio" not in cluster_lines({"scaling": one})[0]


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "cluster", "--sizes", "1M,lots"], "Error: --sizes item 'lots' is not a record count"),
    (["bench", "cluster", "--sizes", "1M", "--extra", "[1]"], "Error: --extra must be a JSON object"),
    (["bench", "reprocess", "--records", "100", "--keys", "1000"], "Error: --keys (1,000) cannot exceed --records"),
    (["bench", "reprocess", "--extra", "{bad"], "Error: --extra is not valid JSON"),
    (["bench", "freshness", "--seconds", "-1"], "Error: --seconds must be a positive number, got -1.0"),
])
def test_bad_bench_arguments_end_as_one_line_and_exit_1_before_anything_starts(tmp_path, monkeypatch, argv, message):
    from orchestrator.cli import app

    started = []
    monkeypatch.setattr("orchestrator.dev.broker.EmbeddedBroker.start", lambda self: started.append(self))
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "home"), *argv], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [result.stderr.strip()] and result.stderr.startswith(message)
    assert "Traceback" not in result.output and started == []


def test_the_plain_reference_is_printed_beside_kappa_s_figures():
    from orchestrator.dev.freshbench import reference_lines

    f = freshness_figures([1.0, 2.0, 3.0], produced=3, superseded=0, unseen=0, interval=1.0, poll=0.05)
    assert reference_lines(f) == []                     # --no-reference
    f["plain"] = {**freshness_figures([0.5, 1.0, 1.5], produced=4, superseded=0, unseen=1, interval=1.0, poll=0.05),
                  "live_seconds": 31.0, "process_cpu_seconds": 20.5,
                  "executor": {"cpu_seconds": 6.25}, "spark_jobs_per_batch": {"batches": 30, "median": 7, "max": 9}}
    assert reference_lines(f) == [
        "reference, a plain Spark pipeline on the same topic (from_json, latest row per key, Delta's MERGE from "
        "foreachBatch, the same trigger): p50 1.00 s, p99 1.49 s, max 1.50 s over 3 records (of 4; 1 never seen); "
        "executor CPU 6.2 s, its processes 20.5 s over 31.0 s; 7 Spark jobs per micro-batch (median)",
        "kappa / plain: p50 2.00x, p99 2.00x"]
