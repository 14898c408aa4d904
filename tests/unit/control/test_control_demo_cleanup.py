"""The cleanup of `kappa demo` / `kappa up` stops the job that runs now, under its current PID.

The case of issue 22: v1's first job, spawned by `kappa up`, was stopped by Airflow from another
process (so it stayed a zombie child of `kappa up`), then a rollback started v1 again under a new
PID. Ctrl-C reported v1 as stopped under the zombie's PID, and "still running".
"""

from __future__ import annotations

import io
import os
import signal

import psutil
import pytest
from rich.console import Console

from control_helpers import allocate, end_children, make_spec, wait_for
from orchestrator.dev.demo import Demo, DemoOptions
from orchestrator.dev.demo_stop import report_stopped
from orchestrator.dev.up import Up, UpOptions
from orchestrator.context import Kappa
from orchestrator.core.settings import Settings
from orchestrator.jobctl import inspect_version, start_version
from orchestrator.jobctl.health import CHILDREN
from orchestrator.registry import Registry

PIPELINE = "standardize"   # the demo's pipeline, declared here with the fake job


@pytest.fixture
def spec():
    return make_spec(name=PIPELINE, alias="member_profiles_std")


def _start(k, v, pipeline=PIPELINE) -> int:
    pid = start_version(k.version(pipeline, v), actor="airflow:scheduler").pid
    wait_for(lambda: inspect_version(k.version(pipeline, v)).health == "running", 15, f"the fake job of v{v} to run")
    return pid


def _stopped_elsewhere(k, v, pid) -> None:
    """What Airflow's monitor does from its own process: the job gets SIGTERM and ends, the registry says
    stopped; this process, its parent, does not wait for it, so it stays a zombie."""
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 10, "the job to end (a zombie)")
    k.registry.set_state(PIPELINE, v, "stopped", pid=None,
                         audit={"action": "stop_requested", "actor": "airflow:scheduler", "reason": "grace over"})
    k.registry.audit("stop", actor="airflow:scheduler", pipeline=PIPELINE, version=v, reason="grace over")


def _demo(cls, k, opts):
    demo = cls(opts, Console(file=io.StringIO(), width=200))
    demo.k = k
    return demo


def test_stop_jobs_stops_the_job_running_now_and_reaps_the_zombie_of_the_earlier_one(k, fake_jobs):
    v = allocate(k, PIPELINE).version
    old = _start(k, v)
    _stopped_elsewhere(k, v, old)
    new = _start(k, v)                       # the rollback starts v1 again
    assert new != old and old in CHILDREN

    demo = _demo(Demo, k, DemoOptions())
    demo.started.job_pids = {v: old}         # what the deploy recorded
    stopped = demo.stop_jobs()

    assert stopped == [(f"{PIPELINE} v{v} job", new)]
    assert old not in CHILDREN and not psutil.pid_exists(old)     # reaped, not a zombie any more
    assert not psutil.pid_exists(new)
    stop = k.registry.audit_log(PIPELINE, action="stop")[-1]
    assert (stop.actor, stop.reason, stop.details["pid"]) == ("kappa-demo", "the demo ends", new)
    assert demo.earlier_jobs() == [(f"{PIPELINE} v{v} earlier job", old)]
    out = io.StringIO()
    assert report_stopped(Console(file=out, width=200), stopped, demo.earlier_jobs()) is False
    assert "nothing left running" in out.getvalue() and "still running" not in out.getvalue()
    assert demo.stop_jobs() == []            # the second pass (after Airflow stopped) finds nothing new


def test_a_version_whose_job_was_stopped_earlier_is_reported_as_not_running(k, fake_jobs):
    v = allocate(k, PIPELINE).version
    old = _start(k, v)
    _stopped_elsewhere(k, v, old)

    demo = _demo(Demo, k, DemoOptions())
    demo.started.job_pids = {v: old}
    assert demo.stop_jobs() == []
    said = demo.c.file.getvalue()
    assert f"{PIPELINE} v{v}: no job running (stopped earlier by airflow:scheduler)" in said
    assert "stopped " + PIPELINE not in said
    assert not psutil.pid_exists(old)


def test_kappa_up_stops_the_jobs_as_kappa_up_naming_the_signal(k, fake_jobs):
    v = allocate(k, PIPELINE).version
    pid = _start(k, v)
    up = _demo(Up, k, UpOptions())
    up.stopped_by(signal.SIGINT)
    assert up.stop_jobs() == [(f"{PIPELINE} v{v} job", pid)]
    stop = k.registry.audit_log(PIPELINE, action="stop")[-1]
    assert (stop.actor, stop.reason) == ("kappa-up", "kappa up stopped (SIGINT, Ctrl-C)")


def test_kappa_up_also_stops_the_jobs_of_the_other_pipelines_the_ui_reprocessed(tmp_path, spec, fake_jobs):
    other = make_spec(name="pageviews_hourly", alias="pageviews_hourly_live")
    reg = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    k = Kappa(Settings(home=tmp_path / "home", bootstrap_servers="127.0.0.1:9"), registry=reg,
              pipelines={spec.name: spec, other.name: other})
    try:
        ours, theirs = allocate(k, PIPELINE).version, allocate(k, other.name).version
        pids = _start(k, ours), _start(k, theirs, other.name)
        up = _demo(Up, k, UpOptions())
        assert up.stop_jobs() == [(f"{PIPELINE} v{ours} job", pids[0]), (f"pageviews_hourly v{theirs} job", pids[1])]
        assert not any(psutil.pid_exists(pid) for pid in pids)
        assert k.registry.audit_log(other.name, action="stop")[-1].actor == "kappa-up"
        assert _demo(Demo, k, DemoOptions()).other_pipelines() == []
    finally:
        end_children()
        reg.close()
