"""Reconcile's repairs of job states, each with what it must leave alone, and its error path.

The publish repair of an interrupted flip is in test_control_promote; here: mark_failed,
mark_stopped, stop_orphan_job, serving_job_failed, and a repair that raises (reported; the
other repairs still run).
"""

from __future__ import annotations

import json
import os

import psutil
import pytest

from control_helpers import ALIAS, PIPELINE, allocate, fake_running, make_spec, wait_for
from orchestrator.core.exceptions import SinkError
from orchestrator.context import Kappa
from orchestrator.jobctl import inspect_version, start_version
from orchestrator.jobctl.health import CHILDREN
from orchestrator.lifecycle import reconcile as reconcile_mod
from orchestrator.lifecycle.reconcile import reconcile
from orchestrator.serving import publish_current, read_pointer


def _start(k, v) -> int:
    pid = start_version(k.version(PIPELINE, v), actor="t").pid
    wait_for(lambda: inspect_version(k.version(PIPELINE, v)).health == "running", 15, f"the fake job of v{v} to run")
    return pid


def _stopped_on_its_own(k, v) -> None:
    """The job stops (its STOP file) while the registry is not told: what a crash of `kappa stop` leaves."""
    _start(k, v)
    k.paths(PIPELINE, v).stop_file.write_text("stop")
    wait_for(lambda: inspect_version(k.version(PIPELINE, v)).health == "stopped", 15, f"the fake job of v{v} to stop")


def _reconcile_entries(k):
    return [(e.actor, e.version, e.reason, e.outcome, e.details) for e in k.registry.audit_log(PIPELINE, action="reconcile")]


def _serve(k, v):
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v, actor="t", reason="r")
    k.registry.set_state(PIPELINE, v, "serving")
    publish_current(k, ALIAS)


def test_a_crashed_job_is_restarted_from_its_checkpoint(k, fake_jobs):
    v = allocate(k).version
    fake_jobs[v] = "crash"
    pid = start_version(k.version(PIPELINE, v), actor="t", check_exit_seconds=0).pid
    k.registry.set_state(PIPELINE, v, "backfilling")
    wait_for(lambda: not inspect_version(k.version(PIPELINE, v)).alive, 10, "the fake job to crash")
    fake_jobs[v] = "normal"
    (action,) = reconcile(k, actor="cron")
    error = (f"the job process {pid} exited with code 3 (last state 'starting'); see {k.paths(PIPELINE, v).log_file}")
    assert (action["kind"], action["error"], action["state"], action["attempt"]) == ("restart", error, "backfilling", 1)
    assert action["pid"] != pid and inspect_version(k.version(PIPELINE, v)).alive
    (entry,) = k.registry.audit_log(PIPELINE, action="restart")
    assert (entry.actor, entry.outcome) == ("cron", "ok")
    assert k.registry.get_version(PIPELINE, v).state == "starting"   # a restart goes through starting
    assert reconcile(k, actor="cron") == []


@pytest.mark.parametrize("state, job", [("backfilling", "stopped"),
                                        ("caught_up", "finished"), ("standby", "stopped"), ("standby", "not_started")])
def test_mark_stopped_when_the_job_ended_cleanly(k, fake_jobs, state, job):
    v = allocate(k).version
    if job != "not_started":
        _stopped_on_its_own(k, v)
    if job == "finished":  # an available-now run that reached its end
        status = k.paths(PIPELINE, v).status_file
        status.write_text(json.dumps({**json.loads(status.read_text()), "state": "finished"}))
    k.registry.set_state(PIPELINE, v, state, pid=4242)
    actions = reconcile(k, actor="cron")
    expected = {"kind": "mark_stopped", "was": state, "job": job, "pipeline": PIPELINE, "version": v, "state": state}
    assert actions == [expected]
    rec = k.registry.get_version(PIPELINE, v)
    assert (rec.state, rec.pid, rec.error) == ("stopped", None, None)
    assert _reconcile_entries(k) == [("cron", v, "mark_stopped", "ok", expected)]
    assert reconcile(k, actor="cron") == []


def test_the_serving_version_is_never_marked_stopped(k, fake_jobs):
    v = allocate(k).version
    _stopped_on_its_own(k, v)
    _serve(k, v)
    assert reconcile(k, actor="cron") == []
    assert k.registry.get_version(PIPELINE, v).state == "serving"
    assert _reconcile_entries(k) == []


@pytest.mark.parametrize("state", ["stopped", "retired", "failed"])
def test_stop_orphan_job_stops_a_job_the_registry_says_is_not_running(k, fake_jobs, state):
    v = allocate(k).version
    pid = _start(k, v)
    k.registry.set_state(PIPELINE, v, state)
    before = k.registry.get_version(PIPELINE, v)
    actions = reconcile(k, actor="cron")
    expected = {"kind": "stop_orphan_job", "state": state, "pid": pid, "how": "graceful", "pipeline": PIPELINE,
                "version": v}
    assert actions == [expected]
    assert not psutil.pid_exists(pid) and pid not in CHILDREN
    assert inspect_version(k.version(PIPELINE, v)).health == "stopped"
    after = k.registry.get_version(PIPELINE, v)
    assert (after.state, after.error, after.stopped_at) == (state, before.error, before.stopped_at)  # left as it was
    (stop,) = k.registry.audit_log(PIPELINE, action="stop")
    assert (stop.actor, stop.outcome, stop.details["how"], stop.details["pid"]) == ("cron", "ok", "graceful", pid)
    assert stop.reason == f"reconcile: the registry says {state}, but its job was running"
    assert _reconcile_entries(k) == [("cron", v, "stop_orphan_job", "ok", expected)]
    assert reconcile(k, actor="cron") == []


def test_a_serving_job_that_failed_for_good_keeps_serving_with_the_error(k):
    v = allocate(k).version
    _serve(k, v)
    fake_running(k, v, state="failed", error="SinkError: disk full")
    (action,) = reconcile(k, actor="cron")
    assert (action["kind"], action["state"], action["failure"]) == ("gave_up", "serving", "SinkError")
    rec = k.registry.get_version(PIPELINE, v)
    assert rec.state == "serving" and "SinkError: disk full" in rec.error
    assert k.registry.get_alias(ALIAS).version == v and read_pointer(k.alias_file(ALIAS))["version"] == v
    assert [e.outcome for e in k.registry.audit_log(PIPELINE, action="restart")] == ["gave_up"]
    (again,) = reconcile(k, actor="cron")          # said again every pass (monitor raises), audited once
    assert again["kind"] == "gave_up"
    assert [e.outcome for e in k.registry.audit_log(PIPELINE, action="restart")] == ["gave_up"]


def _failed_and_gone(k, v, pipeline=PIPELINE, error="RulesError: bad rule") -> None:
    """The job reported failure and exited (its PID belongs to another process now)."""
    fake_running(k, v, pipeline, state="failed", error=error)
    launch = k.paths(pipeline, v).launch_file
    launch.write_text(json.dumps({**json.loads(launch.read_text()), "created": 1.0}))


def _two_pipelines(k) -> Kappa:
    return Kappa(k.settings, registry=k.registry,
                 pipelines={PIPELINE: make_spec(), "other": make_spec(name="other", alias="other_live")})


def test_a_repair_that_raises_is_reported_and_the_other_repairs_still_run(k):
    kk = _two_pipelines(k)
    v1, v2 = allocate(kk).version, allocate(kk).version
    fake_running(kk, v1)           # "its job" is this very process: stopping it is refused
    kk.registry.set_state(PIPELINE, v1, "stopped")
    _failed_and_gone(kk, v2)
    kk.registry.set_state(PIPELINE, v2, "backfilling")
    o1 = allocate(kk, "other").version
    _failed_and_gone(kk, o1, "other", error="SinkError: disk full")
    kk.registry.set_state("other", o1, "caught_up")
    actions = reconcile(kk, actor="cron")
    refusal = (f"the job of {PIPELINE} v{v1} is recorded with this very process's PID ({os.getpid()}); refusing "
               f"to signal it. Check {kk.paths(PIPELINE, v1).launch_file}")
    assert [(a["kind"], a["pipeline"], a["version"]) for a in actions] == [
        ("error", PIPELINE, v1), ("gave_up", PIPELINE, v2), ("gave_up", "other", o1)]
    assert "the job reported failure: RulesError: bad rule" in actions[1]["error"]
    assert "the job reported failure: SinkError: disk full" in actions[2]["error"]
    assert actions[0] == {"kind": "error", "pipeline": PIPELINE, "version": v1, "state": "stopped", "error": refusal}
    assert [r.state for r in kk.registry.list_versions(PIPELINE)] == ["stopped", "failed"]
    assert kk.registry.get_version("other", o1).state == "failed"
    assert kk.registry.audit_log(PIPELINE, action="reconcile") == []   # reported, not audited each minute
    assert reconcile(kk, actor="cron") == [actions[0]]   # still refused next time, the others failed for good


def test_a_failing_publish_is_reported_and_the_versions_are_still_reconciled(k, monkeypatch):
    v1, v2 = allocate(k).version, allocate(k).version
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v1, actor="t", reason="r")
    fake_running(k, v2, state="failed", error="RulesError: bad rule")
    k.registry.set_state(PIPELINE, v2, "backfilling")

    def refuse(k, alias):
        raise SinkError(f"cannot write the pointer of alias {alias!r}: read-only file system")

    monkeypatch.setattr(reconcile_mod, "publish_current", refuse)
    actions = reconcile(k, actor="cron")
    assert actions[0] == {"kind": "error", "pipeline": PIPELINE, "alias": ALIAS,
                          "error": f"cannot write the pointer of alias '{ALIAS}': read-only file system"}
    assert [(a["kind"], a["version"]) for a in actions[1:]] == [("gave_up", v2)]
    assert read_pointer(k.alias_file(ALIAS)) is None and k.registry.get_alias(ALIAS).published_version is None
    assert k.registry.get_version(PIPELINE, v2).state == "failed"
