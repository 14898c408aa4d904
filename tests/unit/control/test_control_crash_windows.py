"""Windows the control-plane model test (test_control_model.py) found, each forced here.

1. A stop cut off right after it marked the version stopped, or a start cut off right after its
   lease moved the version to starting, left the state change with no audit entry: the state and
   its `stop_requested` / `start_requested` entry are now one transaction.
2. A start cut off between spawning the job and recording its PID left a job that nothing could
   see (launch.json was written only after the spawn): it was never stopped, and a later start
   ran a second job beside it. The launch record is now written before the spawn, with a launch
   id that the job's processes carry in their environment, and `inspect_version` finds the job.
3. Two retires of one version deleting its files at once: the second's rmtree failed on files
   the first had already deleted, and the one that finished second failed its final state change.
4. A start cut off after launching the job (its lease still fresh) and a stop cut off after marking
   the version stopped left a job running for a stopped version: reconcile stops it once the dead
   start's lease runs out (the model's final reconcile now comes after the leases ran out).

The jobs are fake job processes; the interleavings are forced with crash points and a hook.
"""

from __future__ import annotations

import threading
from pathlib import Path
import psutil
import pytest

from control_helpers import PIPELINE, allocate, end_children, profiles, wait_for, write_table
from orchestrator.core import crashpoints
from orchestrator.jobctl import inspect_version, start_version, stop_version
from orchestrator.jobctl.health import CHILDREN
from orchestrator.lifecycle import retire as retire_mod
from orchestrator.lifecycle.reconcile import reconcile
from orchestrator.lifecycle.retire import retire

ROWS = [("m1", "swe", "SWE", "Ada", 1), ("m2", "pm", "PM", "Grace", 2)]


@pytest.fixture(autouse=True)
def _disarm():
    crashpoints.disarm()
    yield
    crashpoints.disarm()


def running(k, state: str = "caught_up") -> int:
    v = allocate(k).version
    start_version(k.version(PIPELINE, v), actor="t")
    wait_for(lambda: inspect_version(k.version(PIPELINE, v)).health == "running", 15, f"the fake job of v{v} to run")
    k.registry.set_state(PIPELINE, v, state, expected="starting")
    return v


def live(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_a_stop_cut_off_after_marking_the_version_leaves_its_audit_entry(k, fake_jobs):
    v = running(k)
    pid = inspect_version(k.version(PIPELINE, v)).pid
    with crashpoints.armed_at("stop.marked"), pytest.raises(crashpoints.KappaCrashed):
        stop_version(k.version(PIPELINE, v), actor="alice", reason="not needed")
    assert k.registry.get_version(PIPELINE, v).state == "stopped"
    (entry,) = k.registry.audit_log(PIPELINE, action="stop_requested")
    assert (entry.version, entry.actor, entry.reason, entry.details["from"]) == (v, "alice", "not needed",
                                                                                   "caught_up")
    assert live(pid)                         # cut off before the signal: the job still runs ...
    reconcile(k, actor="cron")               # ... until reconcile stops the job of a stopped version
    assert not inspect_version(k.version(PIPELINE, v)).alive and not live(pid)


def test_a_job_left_by_a_dead_start_and_a_cut_off_stop_is_stopped_once_the_dead_start_s_lease_runs_out(
        k, fake_jobs):
    # found by the model: a deploy dies after launching v's job (its lease still fresh), then a
    # retire dies after marking v stopped. The job runs for a stopped version; reconcile leaves a
    # version with a fresh lease to its holder, so the job is stopped when that lease runs out.
    v = allocate(k).version
    with crashpoints.armed_at("start.launched"), pytest.raises(crashpoints.KappaCrashed):
        start_version(k.version(PIPELINE, v), actor="deployer")
    pid = inspect_version(k.version(PIPELINE, v)).pid
    with crashpoints.armed_at("stop.marked"), pytest.raises(crashpoints.KappaCrashed):
        stop_version(k.version(PIPELINE, v), actor="retirer")
    rec = k.registry.get_version(PIPELINE, v)
    assert rec.state == "stopped" and rec.lease_held() and live(pid)
    reconcile(k, actor="cron")
    assert live(pid)                         # the lease's holder is left to finish
    k.registry.take_lease(PIPELINE, v, owner=rec.lease_owner, expected=("stopped",), ttl=-1)  # it runs out
    reconcile(k, actor="cron")
    wait_for(lambda: not live(pid), 15, f"the stray job {pid} to be gone")
    assert not inspect_version(k.version(PIPELINE, v)).alive and k.registry.get_version(PIPELINE, v).state == "stopped"


def test_a_start_cut_off_after_taking_its_lease_leaves_its_audit_entry(k, fake_jobs):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "failed", error="it died")
    with crashpoints.armed_at("start.leased"), pytest.raises(crashpoints.KappaCrashed):
        start_version(k.version(PIPELINE, v), actor="bob", reason="roll back to it")
    assert k.registry.get_version(PIPELINE, v).state == "starting"
    (entry,) = k.registry.audit_log(PIPELINE, action="start_requested")
    assert (entry.version, entry.actor, entry.reason, entry.details["from"]) == (v, "bob", "roll back to it",
                                                                                   "failed")


def test_a_start_cut_off_after_the_spawn_leaves_a_job_that_can_be_seen_and_stopped(k, fake_jobs):
    v = allocate(k).version
    before = set(CHILDREN)
    with crashpoints.armed_at("start.spawned"), pytest.raises(crashpoints.KappaCrashed):
        start_version(k.version(PIPELINE, v), actor="deployer")
    (pid,) = set(CHILDREN) - before
    orphan = CHILDREN.pop(pid)               # what the process that died knew about its child is gone,
    threading.Thread(target=orphan.wait, daemon=True).start()   # and init reaps the orphan when it exits
    seen = inspect_version(k.version(PIPELINE, v))
    assert (seen.alive, seen.pid) == (True, pid)
    # a second start does not run a second job beside it
    again = start_version(k.version(PIPELINE, v), actor="rollback")
    assert (again.started, again.pid) == (False, pid)
    # the lease of the dead start expires; a stop then stops that job
    rec = k.registry.get_version(PIPELINE, v)
    k.registry.take_lease(PIPELINE, v, owner=rec.lease_owner, expected=(rec.state,), ttl=-1)
    res = stop_version(k.version(PIPELINE, v), actor="op", reason="clean up")
    assert (res.stopped, res.pid) == (True, pid)
    wait_for(lambda: not live(pid), 15, f"the stray job {pid} to be gone")
    assert k.registry.get_version(PIPELINE, v).state == "stopped"


def test_a_start_cut_off_before_the_spawn_shows_no_job(k, fake_jobs, monkeypatch):
    from orchestrator.jobctl import launch

    v = allocate(k).version

    def no_spawn(*a, **kw):
        raise crashpoints.KappaCrashed("died before the spawn")

    monkeypatch.setattr(launch.subprocess, "Popen", no_spawn)
    with pytest.raises(crashpoints.KappaCrashed):
        start_version(k.version(PIPELINE, v), actor="deployer")
    seen = inspect_version(k.version(PIPELINE, v))
    assert (seen.health, seen.alive) == ("not_started", False)


def test_two_retires_of_one_version_deleting_its_files_at_once_both_end_well(k, fake_jobs, monkeypatch):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "stopped")
    paths = k.paths(PIPELINE, v)
    write_table(paths.table, profiles(ROWS))
    Path(paths.checkpoint).mkdir(parents=True)
    (Path(paths.checkpoint) / "offsets").write_text("0")
    real_delete_tree = retire_mod.uris.delete_tree
    other: list = []

    def delete_after_the_other_retire(location):
        if not other:                        # the other retire runs to its end right here
            other.append(None)
            other[0] = retire(k.version(PIPELINE, v), actor="bob", reason="second")
        return real_delete_tree(location)

    monkeypatch.setattr(retire_mod.uris, "delete_tree", delete_after_the_other_retire)
    monkeypatch.setattr(retire_mod, "_delete_group", lambda k, g: "deleted")  # no broker here
    first = retire(k.version(PIPELINE, v), actor="alice", reason="first")
    assert other[0].message.startswith(f"retired {PIPELINE} v{v}")
    assert first.message.startswith(f"retired {PIPELINE} v{v}")
    assert k.registry.get_version(PIPELINE, v).state == "retired"
    assert not Path(paths.table).exists() and not paths.version_dir.exists()
    end_children()
