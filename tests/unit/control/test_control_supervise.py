"""Issue 9, case 16 (supervision): a version whose job died is restarted from its checkpoint with
backoff and a bound, each restart audited, the history kept in the registry; past the bound (or
after a deterministic failure) the version is failed and the monitor raises.

Fake job processes (fake_job.py) started through the real `start_version`; deaths are real
(SIGKILL of the job's process group, or a job that reports failure). Time is passed to
`supervise_version` as `now`, so backoff is checked to the second without sleeping.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from control_helpers import ALIAS, PIPELINE, allocate, make_spec, wait_for
from orchestrator.core.exceptions import ConflictError, LifecycleError
from orchestrator.context import Kappa
from orchestrator.jobctl import inspect_version, start_version
from orchestrator.lifecycle import supervise as sup
from orchestrator.lifecycle.monitor import monitor
from orchestrator.lifecycle.supervise import supervise_version
from orchestrator.registry import Registry
from orchestrator.serving import publish_current, set_serving_states

BACKOFF = 30.0
BOUND = 2


@pytest.fixture
def spec():
    return make_spec(max_restarts=BOUND, restart_window_seconds=600.0, restart_backoff_seconds=BACKOFF,
                     restart_backoff_max_seconds=45.0)


def start(k, v: int, **kw) -> int:
    pid = start_version(k.version(PIPELINE, v), actor="operator", reason="test start", **kw).pid
    wait_for(lambda: inspect_version(k.version(PIPELINE, v)).health == "running", 15, f"the fake job of v{v} to run")
    return pid


def kill(k, v: int) -> None:
    """kill -9 of the job's process group, as an operator or the OOM killer would."""
    pid = inspect_version(k.version(PIPELINE, v)).pid
    os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: inspect_version(k.version(PIPELINE, v)).failed, 15, f"v{v}'s job to count as dead")


def decide(k, v: int, now: float | None = None) -> dict | None:
    ref = k.version(PIPELINE, v)
    return supervise_version(ref, inspect_version(ref), actor="supervisor", now=now)


def restarts(k, v: int) -> list:
    return k.registry.audit_log(PIPELINE, limit=None, version=v, action=sup.ACTION)


def test_a_killed_job_is_restarted_at_once_and_the_restart_audited(k, fake_jobs):
    v = allocate(k).version
    old = start(k, v)
    kill(k, v)
    d = decide(k, v)
    assert (d["kind"], d["attempt"], d["failure"]) == ("restart", 1, "died"), d
    assert d["pid"] != old and "exited" in d["error"]
    wait_for(lambda: inspect_version(k.version(PIPELINE, v)).health == "running", 15, "the restarted job to run")
    [entry] = restarts(k, v)
    assert (entry.outcome, entry.actor, entry.details["attempt"], entry.details["pid"]) == ("ok", "supervisor", 1,
                                                                                           d["pid"])
    assert entry.details["dead_pid"] == old and entry.reason.startswith(sup.REASON)
    starts = k.registry.audit_log(PIPELINE, limit=None, version=v, action="start")
    assert starts[-1].reason.startswith(sup.REASON) and starts[-1].details["pid"] == d["pid"]
    assert decide(k, v) is None  # healthy again: nothing to decide


def test_backoff_between_restarts_is_respected_to_the_second(k, fake_jobs):
    v = allocate(k).version
    start(k, v)
    kill(k, v)
    assert decide(k, v)["kind"] == "restart"
    first = restarts(k, v)[-1].at
    kill(k, v)
    pending = decide(k, v, now=first + BACKOFF - 1)
    assert pending["kind"] == "restart_pending" and pending["in_seconds"] == pytest.approx(1.0, abs=0.01)
    assert pending["attempt"] == 2 and len(restarts(k, v)) == 1
    assert not inspect_version(k.version(PIPELINE, v)).alive  # nothing was started meanwhile
    d = decide(k, v, now=first + BACKOFF)
    assert (d["kind"], d["attempt"]) == ("restart", 2)
    assert sup.backoff_seconds(k.pipeline(PIPELINE), 2) == 45.0  # doubled (60), capped at the max


def test_past_the_bound_the_version_is_failed_and_the_give_up_audited(k, fake_jobs):
    v = allocate(k).version
    start(k, v)
    t0 = time.time()
    for attempt in range(1, BOUND + 1):    # each after its backoff, all within the 600 s window
        kill(k, v)
        d = decide(k, v, now=t0 + 100 * attempt)
        assert (d["kind"], d["attempt"]) == ("restart", attempt)
    kill(k, v)
    d = decide(k, v, now=t0 + 100 * (BOUND + 1))
    assert d["kind"] == "gave_up", d
    rec = k.registry.get_version(PIPELINE, v)
    assert rec.state == "failed" and f"{PIPELINE} v{v}: its job died again after {BOUND} restarts" in rec.error
    assert [e.outcome for e in restarts(k, v)] == ["ok"] * BOUND + ["gave_up"]
    assert restarts(k, v)[-1].details["log_tail"]
    assert decide(k, v) is None  # failed is not a running state: nothing is restarted any more


def test_restarts_outside_the_window_do_not_count(k, fake_jobs):
    v = allocate(k).version
    start(k, v)
    for _ in range(BOUND):
        kill(k, v)
        assert decide(k, v, now=time.time() + 100)["kind"] == "restart"
    kill(k, v)
    d = decide(k, v, now=time.time() + 601)   # both restarts are older than the 600 s window
    assert (d["kind"], d["attempt"]) == ("restart", 1)


def test_the_history_survives_an_orchestrator_restart(k, fake_jobs, tmp_path):
    v = allocate(k).version
    start(k, v)
    kill(k, v)
    assert decide(k, v)["kind"] == "restart"
    first = restarts(k, v)[-1].at
    kill(k, v)
    # a new orchestrator process: a fresh registry connection and facade, nothing kept in memory
    reg = Registry(f"sqlite:///{tmp_path / 'registry.db'}")   # the k fixture's database
    try:
        k2 = Kappa(k.settings, registry=reg, pipelines=dict(k.pipelines))
        assert decide(k2, v, now=first + 5)["kind"] == "restart_pending"
        d = decide(k2, v, now=first + BACKOFF + 1)
        assert (d["kind"], d["attempt"]) == ("restart", 2)
    finally:
        reg.close()


@pytest.mark.parametrize("error, kind, restarted", [
    ("SourceError: broker unavailable: cannot read topic metadata from Kafka at h:1: no answer for 120 s",
     "broker_unavailable", True),
    ("Py4JNetworkError: An error occurred while trying to connect to the Java server", "Py4JNetworkError", True),
    ("SinkError: member_id m1 has records in partitions 0 and 3; key_order=partition refuses", "SinkError", False),
    ("SourceError: topic 't' does not exist on h:1", "SourceError", False),
    ("RulesError: bad rule", "RulesError", False),
])
def test_a_reported_failure_is_restarted_unless_a_restart_would_repeat_it(k, fake_jobs, error, kind, restarted):
    v = allocate(k).version
    start(k, v)
    kill(k, v)
    status = k.paths(PIPELINE, v).status_file
    status.write_text(json.dumps({**json.loads(status.read_text()), "state": "failed", "error": error}))
    d = decide(k, v)
    assert d["failure"] == kind
    if restarted:
        assert d["kind"] == "restart"
        return
    assert d["kind"] == "gave_up" and f"its job reported a {kind}, which a restart would repeat" in d["error"]
    assert k.registry.get_version(PIPELINE, v).state == "failed"
    assert [e.outcome for e in restarts(k, v)] == ["gave_up"]
    assert not inspect_version(k.version(PIPELINE, v)).alive


def test_a_job_that_reports_bad_rules_is_not_restarted_in_a_loop(k, fake_jobs):
    v = allocate(k).version
    fake_jobs[v] = "fail"      # reports state failed with "RulesError: bad rule", exit 1
    start_version(k.version(PIPELINE, v), actor="operator", check_exit_seconds=0)
    wait_for(lambda: inspect_version(k.version(PIPELINE, v)).failed, 15, "the job to report its failure")
    assert decide(k, v)["kind"] == "gave_up"
    assert [e.action for e in k.registry.audit_log(PIPELINE, limit=None, version=v)
            if e.action in ("start", sup.ACTION)] == ["start", sup.ACTION]


def test_a_hung_job_is_stopped_then_restarted(k, fake_jobs):
    v = allocate(k).version
    fake_jobs[v] = "hang"
    old = start(k, v)
    status = k.paths(PIPELINE, v).status_file
    status.write_text(json.dumps({**json.loads(status.read_text()), "heartbeat_at": time.time() - 3600}))
    st = inspect_version(k.version(PIPELINE, v))
    assert st.alive and st.failed
    fake_jobs[v] = "normal"
    d = decide(k, v)
    assert (d["kind"], d["failure"]) == ("restart", "hung") and d["pid"] != old
    wait_for(lambda: not psutil_alive(old), 15, "the hung job to be stopped")


def psutil_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_start_by_anyone_else_resets_the_history_and_lifts_a_give_up(k, fake_jobs):
    v = allocate(k).version
    start(k, v)
    t0 = time.time()
    for attempt in range(BOUND + 1):
        kill(k, v)
        decide(k, v, now=t0 + 100 * (attempt + 1))
    assert k.registry.get_version(PIPELINE, v).state == "failed"
    start(k, v)                     # the operator fixed the cause and started it
    kill(k, v)
    d = decide(k, v)
    assert (d["kind"], d["attempt"]) == ("restart", 1)


def test_a_version_being_started_by_someone_else_is_left_alone(k, fake_jobs, monkeypatch):
    import orchestrator.jobctl as jobctl

    v = allocate(k).version
    start(k, v)
    kill(k, v)

    def busy(*a, **kw):
        raise ConflictError(f"{PIPELINE} v{v}'s lease is held by another start")

    monkeypatch.setattr(jobctl, "start_version", busy)
    d = decide(k, v)
    assert d["kind"] == "busy" and "lease is held" in d["error"]
    assert restarts(k, v) == []


def _serving(k, v: int) -> None:
    k.registry.set_state(PIPELINE, v, "caught_up")
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v, actor="t", reason="r")
    set_serving_states(k, k.pipeline(PIPELINE), v, None)
    publish_current(k, ALIAS)
    assert k.registry.get_version(PIPELINE, v).state == "serving"


def test_the_serving_version_is_restarted_and_past_the_bound_keeps_serving_and_the_monitor_raises(
        k, fake_jobs, fake_log):
    v = allocate(k).version
    start(k, v)
    fake_log.read_all()
    _serving(k, v)
    kill(k, v)
    d = decide(k, v)
    assert d["kind"] == "restart" and k.registry.get_version(PIPELINE, v).state == "serving"
    wait_for(lambda: inspect_version(k.version(PIPELINE, v)).health == "running", 15, "the serving job to run again")
    t0 = time.time()
    for attempt in range(BOUND - 1):
        kill(k, v)
        assert decide(k, v, now=t0 + 100 * (attempt + 1))["kind"] == "restart"
    kill(k, v)
    d = decide(k, v, now=t0 + 100 * BOUND)
    assert d["kind"] == "gave_up"
    rec = k.registry.get_version(PIPELINE, v)
    assert rec.state == "serving" and rec.error.startswith(f"{PIPELINE} v{v}: its job died again")
    again = decide(k, v)   # a later pass: still given up, said again, not restarted
    assert again["kind"] == "gave_up" and len(restarts(k, v)) == BOUND + 1
    # before reconcile calls the supervisor, the monitor raises about the failing serving job; after,
    # with the supervisor's give-up (which names the bound)
    with pytest.raises(LifecycleError, match=rf"{PIPELINE} v{v}(: its job died again after {BOUND} restarts| "
                                             rf"serves alias '{ALIAS}' but is failing)"):
        monitor(k, actor="cron")


def test_a_monitor_pass_restarts_a_dead_serving_job(k, fake_jobs, fake_log):
    v = allocate(k).version
    start(k, v)
    fake_log.read_all()
    _serving(k, v)
    kill(k, v)
    report = monitor(k, actor="cron")
    assert [a["kind"] for a in report.reconciled if a.get("version") == v] == ["restart"]
    assert inspect_version(k.version(PIPELINE, v)).alive and restarts(k, v)[-1].outcome == "ok"


def test_a_monitor_pass_that_gives_up_fails_the_version_and_raises_naming_it(k, fake_jobs, fake_log):
    v = allocate(k).version
    start(k, v)
    t0 = time.time()
    for attempt in range(BOUND):
        kill(k, v)
        assert decide(k, v, now=t0 + 100 * (attempt + 1))["kind"] == "restart"
    kill(k, v)
    with pytest.raises(LifecycleError, match=rf"{PIPELINE} v{v}: its job died again after {BOUND} restarts"):
        monitor(k, actor="cron")
    assert k.registry.get_version(PIPELINE, v).state == "failed"
