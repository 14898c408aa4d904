"""Helpers of the control-plane unit tests: a declared pipeline, a fake log, fake jobs, Delta tables."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pytest

from orchestrator.observe import estimate as estimate_mod
from orchestrator.observe import lag as lag_mod
from orchestrator.jobctl import launch
from orchestrator.jobctl.health import CHILDREN
from orchestrator.core.settings import Settings
from orchestrator.context import Kappa
from orchestrator.core.exceptions import BrokerUnreachable
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.registry import Registry
from tests.waiting import wait_until

FAKE_JOB = Path(__file__).with_name("fake_job.py")
PIPELINE = "orders"
ALIAS = "orders_live"
TOPIC = "orders"
#: How long a test waits for a SIGKILLed fake job to be gone. It is gone at once, unless the kernel holds it
#: in an uninterruptible write (its status file) on a loaded disk: a suite run once saw one outlive 15 s.
#: The bound only caps a hang; a wait returns as soon as the process is gone.
KILL_BOUND = 120.0


def make_spec(**overrides) -> PipelineSpec:
    fields = dict(name=PIPELINE, job="standardize", topics=(TOPIC,), key="member_id", alias=ALIAS,
                  catchup_threshold=0, catchup_samples=3, grace_period_seconds=60.0, keep_versions=2,
                  key_count_tolerance=0.1, max_reject_rate=0.05)
    fields.update(overrides)
    return PipelineSpec(**fields)


@pytest.fixture
def spec() -> PipelineSpec:
    return make_spec()


@pytest.fixture
def k(tmp_path, spec):
    settings = Settings(home=tmp_path / "home", bootstrap_servers="127.0.0.1:9")
    reg = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    kk = Kappa(settings, registry=reg, pipelines={spec.name: spec})
    try:
        yield kk
    finally:
        end_children()
        reg.close()


def end_children() -> None:
    """Kill the (fake) jobs this process started that are still running, and forget them."""
    for pid, proc in list(CHILDREN.items()):
        if proc.poll() is None:
            proc.kill()
            proc.wait(KILL_BOUND)
        CHILDREN.pop(pid, None)


def allocate(k, pipeline: str = PIPELINE, **details):
    return k.registry.allocate_version(pipeline, rules_version=None, rules_hash=None, code_ref="test",
                                       paths=lambda n: k.paths(pipeline, n), actor="tester",
                                       reason="unit test", queue=True, details=details or None)


class FakeLog:
    """The broker's log offsets, the consumer group's and the checkpoint's, all in memory; `age` is how
    old the oldest unprocessed record is (the lag in seconds of a version that has any lag)."""

    def __init__(self, ends: dict[int, int]):
        self.starts = {(TOPIC, p): 0 for p in ends}
        self.ends = {(TOPIC, p): e for p, e in ends.items()}
        self.checkpoint: dict | None = None
        self.group: dict = {}
        self.down = False
        self.age: float | None = 2.0

    def read_all(self, p: int | None = None) -> None:
        self.checkpoint = dict(self.ends) if p is None else {**(self.checkpoint or {}), (TOPIC, p): self.ends[(TOPIC, p)]}
        self.group = dict(self.checkpoint)

    def install(self, monkeypatch) -> "FakeLog":
        def log_offsets(k, topics, timeout=10.0):
            if self.down:
                raise BrokerUnreachable("cannot read log end offsets from the Kafka broker at 127.0.0.1:9 "
                                  "(KafkaError{code=_TRANSPORT})")
            return {tp: (self.starts[tp], self.ends[tp]) for tp in self.ends}

        monkeypatch.setattr(lag_mod, "log_offsets", log_offsets)
        monkeypatch.setattr(lag_mod, "group_offsets", lambda k, g, topics, timeout=10.0: dict(self.group))
        monkeypatch.setattr(lag_mod, "checkpoint_next_offsets",
                            lambda path: (dict(self.checkpoint), 7) if self.checkpoint else (None, None))
        monkeypatch.setattr(lag_mod, "oldest_unread_age", lambda k, details, *, now, timeout: self.age)
        # the backfill estimate's bytes: 200 B a record, as a broker's segment sizes would say (no JVM tool here)
        monkeypatch.setattr(estimate_mod, "log_dir_bytes",
                            lambda k, topics, timeout=30.0: {TOPIC: 200 * sum(self.ends.values())})
        # ... and a deploy's sample of records (the same 200 B a record)
        monkeypatch.setattr(estimate_mod, "sampled_bytes",
                            lambda k, logs, per_partition=5, timeout=5.0: {TOPIC: 200 * sum(self.ends.values())})
        return self


@pytest.fixture
def fake_log(monkeypatch):
    return FakeLog({0: 100, 1: 50}).install(monkeypatch)


def fake_running(k, version: int, pipeline: str = PIPELINE, *, state: str = "running",
                 heartbeat_age: float = 0.0, **status) -> None:
    """Make `version` look like a live job: this test process is its PID, status.json fresh.

    The launch file is one from before kappa recorded `created` (only `started_at`), so the
    tests that use it also cover reading old launch files.
    """
    paths = k.paths(pipeline, version)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    me = psutil.Process()
    (paths.launch_file).write_text(json.dumps({"pid": os.getpid(), "mode": "local", "started_at": me.create_time()}))
    now = time.time()
    data = {"pipeline": pipeline, "version": version, "pid": os.getpid(), "state": state,
            "started_at": me.create_time(), "heartbeat_at": now - heartbeat_age, "batch_id": 3, "batches": 4,
            "rows_in": 10, "rows_out": 9, "rejects": 1, "end_offsets": None, "error": None}
    data.update(status)
    paths.status_file.write_text(json.dumps(data))


def ready_version(k, fake_log, rows, state="caught_up"):
    """A version whose fake job runs, caught up (lag 0 for two samples already, a micro-batch apart: its
    job has committed 4 since it started, the samples were taken after its 1st and 2nd), with a table."""
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, state)
    fake_running(k, v)
    fake_log.read_all()
    write_table(k.paths(PIPELINE, v).table, profiles(rows))
    for batches in (1, 2):
        k.registry.add_lag_sample(PIPELINE, v, 0, {}, lag_seconds=0.0, batches=batches)
    return v


def commit_batch(k, version: int, pipeline: str = PIPELINE) -> int:
    """The fake job of `version` (`fake_running`) reports one more micro-batch committed; the new count."""
    path = k.paths(pipeline, version).status_file
    data = json.loads(path.read_text())
    data.update(batches=(data.get("batches") or 0) + 1, heartbeat_at=time.time())
    path.write_text(json.dumps(data))
    return data["batches"]


def samples_a_batch_apart(k, version: int, n: int, pipeline: str = PIPELINE, **kw) -> list:
    """`n` readiness decisions, the fake job committing a micro-batch before each."""
    from orchestrator.lifecycle.await_ready import readiness

    out = []
    for _ in range(n):
        commit_batch(k, version, pipeline)
        out.append(readiness(k.version(pipeline, version), **kw))
    return out


@pytest.fixture
def fake_jobs(monkeypatch):
    """Start fake job processes through start_version: {version: behaviour}."""
    return install_fake_jobs(monkeypatch)


def install_fake_jobs(monkeypatch) -> dict[int, str]:
    """start_version launches fake_job.py instead of Spark; returns {version: behaviour} to fill in."""
    behaviours: dict[int, str] = {}

    def job_command(v, *, trigger="continuous", rules_file=None, master=None):
        return ([sys.executable, str(FAKE_JOB), "--run-dir", str(v.paths.run_dir),
                 "--behaviour", behaviours.get(v.version, "normal")], "local")

    monkeypatch.setattr(launch, "job_command", job_command)
    return behaviours


class Clock:
    """A clock the test sets, installed as the `time` module of the modules that read it.

    `time()` is `now`; `monotonic()` counts from 0; `sleep(s)` advances both at once (no real
    sleep). Everything else is the real `time` module's.
    """

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now
        self.mono = 0.0
        self.slept: list[float] = []

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        self.mono += seconds

    def __getattr__(self, name):
        return getattr(time, name)

    def install(self, monkeypatch, *modules) -> "Clock":
        for module in modules:
            monkeypatch.setattr(module, "time", self)
        return self


def wait_for(predicate, timeout: float = 10.0, what: str = "condition"):
    """`predicate()`'s first true value; the test fails naming `what` if none comes within `timeout` s."""
    return wait_until(predicate, what, timeout, poll=0.05)


def profiles(rows: list[tuple]) -> pa.Table:
    """A standardize-like table: member_id, title_raw, title, name, source_offset."""
    cols = list(zip(*rows)) if rows else [[], [], [], [], []]
    return pa.table({
        "member_id": pa.array(cols[0], pa.string()),
        "title_raw": pa.array(cols[1], pa.string()),
        "title": pa.array(cols[2], pa.string()),
        "name": pa.array(cols[3], pa.string()),
        "source_offset": pa.array(cols[4], pa.int64()),
    })


def write_table(path: Path, table: pa.Table) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(path), table, mode="overwrite")
