"""The job runtime as a real process: status.json states, graceful stop, failure exit codes.

Each test runs ``python -m tests.integration.source.echo_job`` (its own Spark driver) against
the session's embedded broker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.lib.runtime.status import read_status
from jobs.lib.source.checkpoint import checkpoint_offsets, last_committed_batch
from tests.integration.source.source_helpers import WAIT_SECONDS, read_parquet_rows

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


class Job:
    def __init__(self, kafka, topic: str, tmp_path: Path, *extra_args: str, extra: dict | None = None):
        self.dir = tmp_path
        self.run_dir = tmp_path / "run"
        self.run_dir.mkdir()
        self.output = tmp_path / "out"
        self.checkpoint = tmp_path / "cp"
        self.group = f"kappa.echo_{tmp_path.name[-12:]}.v1"
        args = [sys.executable, "-m", "tests.integration.source.echo_job", "--pipeline", "echo", "--version", "1",
                "--bootstrap-servers", kafka.bootstrap, "--topics", topic, "--output", str(self.output),
                "--checkpoint", str(self.checkpoint), "--run-dir", str(self.run_dir), "--group-id", self.group,
                "--master", "local[2]", *extra_args]
        if extra:
            args += ["--extra", json.dumps(extra)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.log = open(self.run_dir / "job.log", "wb")
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    def status(self) -> dict:
        return read_status(self.run_dir) or {}

    def wait_status(self, predicate, what: str) -> dict:
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            s = self.status()
            if predicate(s):
                return s
            if self.proc.poll() is not None:
                s = self.status()
                if predicate(s):
                    return s
                raise AssertionError(f"job exited ({self.proc.returncode}) before {what}; status {s}\n{self.tail()}")
            time.sleep(0.2)
        raise AssertionError(f"job never reached {what} within {WAIT_SECONDS}s; status {self.status()}\n{self.tail()}")

    def wait_exit(self) -> int:
        try:
            return self.proc.wait(WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"job did not exit within {WAIT_SECONDS}s\n{self.tail()}") from None

    def tail(self) -> str:
        """The end of job.log without Java stack frames, for assertion messages."""
        self.log.flush()
        lines = (self.run_dir / "job.log").read_text(errors="replace").splitlines()
        return "\n".join(ln for ln in lines if not ln.lstrip().startswith("at "))[-6000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.log.close()


@pytest.fixture
def jobs():
    started: list[Job] = []
    yield started
    for j in started:
        j.kill()


def _records(n: int, partitions: int = 2):
    return [(i % partitions, f"k{i}".encode(), f"v{i}".encode()) for i in range(n)]


def test_available_now_job_finishes_with_status_and_group_offsets(kafka, unique, tmp_path, jobs):
    topic = kafka.create_topic(f"rt_done_{unique}", partitions=2)
    kafka.produce(topic, _records(500))
    job = Job(kafka, topic, tmp_path, "--trigger", "available-now", "--max-records-per-batch", "200")
    jobs.append(job)
    assert job.wait_exit() == 0, job.tail()

    s = job.status()
    end = {topic: {"0": 250, "1": 250}}
    assert s["state"] == "finished" and s["error"] is None
    assert (s["pipeline"], s["version"], s["pid"]) == ("echo", 1, job.proc.pid)
    assert s["batches"] >= 3 and s["rows_in"] == 500 and s["rows_out"] == 500 and s["rejects"] == 0
    assert s["batch_id"] == last_committed_batch(job.checkpoint)
    assert s["end_offsets"] == end == checkpoint_offsets(job.checkpoint)
    assert s["rules_hash"] == "echo-rules-hash" and s["rejects_total"] == 0
    assert s["heartbeat_at"] >= s["started_at"]
    assert sorted(r["key"] for r in read_parquet_rows(str(job.output))) == sorted(k for _, k, _ in _records(500))
    assert kafka.wait_group_offsets(job.group, end) == end
    assert list(job.run_dir.glob(".status.json*")) == []  # no temp files left behind


def _stop_test(kafka, unique, tmp_path, jobs, how: str):
    topic = kafka.create_topic(f"rt_{how}_{unique}", partitions=2)
    kafka.produce(topic, _records(200))
    job = Job(kafka, topic, tmp_path, "--trigger", "continuous", "--interval-seconds", "0.5",
              "--max-records-per-batch", "100")
    jobs.append(job)
    first = job.wait_status(lambda s: s.get("state") == "running" and s.get("rows_in", 0) >= 200, "all 200 rows")
    job.wait_status(lambda s: s.get("heartbeat_at", 0) > first["heartbeat_at"], "a heartbeat")
    if how == "stopfile":
        (job.run_dir / "STOP").touch()
    else:
        job.proc.send_signal(signal.SIGTERM)
    assert job.wait_exit() == 0, job.tail()
    s = job.status()
    assert s["state"] == "stopped" and s["error"] is None
    assert s["rows_in"] == 200 and s["batches"] >= 2
    assert s["end_offsets"] == {topic: {"0": 100, "1": 100}} == checkpoint_offsets(job.checkpoint)
    assert len(read_parquet_rows(str(job.output))) == 200


def test_stop_file_stops_gracefully(kafka, unique, tmp_path, jobs):
    _stop_test(kafka, unique, tmp_path, jobs, "stopfile")


def test_sigterm_stops_gracefully(kafka, unique, tmp_path, jobs):
    _stop_test(kafka, unique, tmp_path, jobs, "sigterm")


def test_failing_batch_ends_in_failed_with_exit_1(kafka, unique, tmp_path, jobs):
    topic = kafka.create_topic(f"rt_fail_{unique}", partitions=1)
    kafka.produce(topic, _records(300, partitions=1))
    job = Job(kafka, topic, tmp_path, "--trigger", "available-now", "--max-records-per-batch", "100",
              extra={"fail_at_batch": 1})
    jobs.append(job)
    assert job.wait_exit() == 1, job.tail()
    s = job.status()
    assert s["state"] == "failed"
    assert "echo job told to fail at batch 1" in s["error"]
    assert s["batch_id"] == 0 and s["rows_out"] == 100
    assert checkpoint_offsets(job.checkpoint) == {topic: {"0": 100}}
