"""Executor time and Spark jobs per micro-batch read from Spark's event log (`jobs.lib.runtime.sparkwork`),
which the benchmarks print beside wall time for a job in a process of its own."""

from __future__ import annotations

import json

from jobs.lib.runtime.sparkwork import ExecutorTime, event_log_jobs, event_log_time


def _task(stage: int, cpu_ns: int, run_ms: int, gc_ms: int, finish_ms: int) -> dict:
    return {"Event": "SparkListenerTaskEnd", "Stage ID": stage, "Task Info": {"Finish Time": finish_ms},
            "Task Metrics": {"Executor CPU Time": cpu_ns, "Executor Run Time": run_ms, "JVM GC Time": gc_ms}}


def _job(group: str | None, submitted_ms: int) -> dict:
    return {"Event": "SparkListenerJobStart", "Submission Time": submitted_ms,
            "Properties": {"spark.jobGroup.id": group} if group else {}}


def test_tasks_and_jobs_are_summed_from_finished_and_running_logs(tmp_path):
    (tmp_path / "app-1").write_text("\n".join(json.dumps(e) for e in [
        {"Event": "SparkListenerApplicationStart"}, _job("kappa-a-batch-0", 1_000), _task(0, 2_000_000_000, 2500, 100, 1_500),
        _job("kappa-a-batch-1", 10_000), _job("kappa-a-batch-1", 10_100), _task(1, 500_000_000, 700, 0, 10_600)]) + "\n")
    (tmp_path / "app-2.inprogress").write_text(json.dumps(_task(0, 1_000_000_000, 1000, 0, 20_000)) + "\n" + '{"Event": "SparkListenerTaskEnd", "Ta')
    total = event_log_time(tmp_path)
    assert total == ExecutorTime(cpu_seconds=3.5, run_seconds=4.2, gc_seconds=0.1, stages=3)
    assert event_log_time(tmp_path, since=10.0) == ExecutorTime(cpu_seconds=1.5, run_seconds=1.7, gc_seconds=0.0, stages=2)
    assert event_log_jobs(tmp_path) == {"kappa-a-batch-0": 1, "kappa-a-batch-1": 2}
    assert event_log_jobs(tmp_path, since=5.0) == {"kappa-a-batch-1": 2}
    assert event_log_time(tmp_path / "none") == ExecutorTime()


def test_spark_4_rolled_logs_are_read_from_their_folders_and_a_compressed_one_is_refused(tmp_path):
    """Spark 4 writes `eventlog_v2_<app>/events_<n>_<app>` (rolling on by default) and compresses with zstd
    unless told not to: a folder is one application, and a compressed file is an error, not 0 CPU seconds."""
    import pytest

    app = tmp_path / "eventlog_v2_local-1"
    app.mkdir()
    (app / "appstatus_local-1.inprogress").write_text("")
    (app / "events_1_local-1").write_text(json.dumps(_task(0, 1_000_000_000, 1200, 0, 1_000)) + "\n")
    (app / "events_2_local-1.inprogress").write_text(json.dumps(_task(0, 1_000_000_000, 800, 0, 2_000)) + "\n"
                                                     + json.dumps(_job("kappa-a-batch-3", 1_500)) + "\n")
    assert event_log_time(tmp_path) == ExecutorTime(cpu_seconds=2.0, run_seconds=2.0, gc_seconds=0.0, stages=1)
    assert event_log_jobs(tmp_path) == {"kappa-a-batch-3": 1}
    (app / "events_3_local-1.zstd").write_bytes(b"\x28\xb5\x2f\xfd")
    with pytest.raises(ValueError, match="is compressed.*spark.eventLog.compress=false"):
        event_log_time(tmp_path)
