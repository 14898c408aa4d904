"""Issue 9's races and crash windows, each forced by a hook or a barrier (no sleeps and luck).

Every test names its case from the issue. The jobs are fake job processes (fake_job.py through
`start_version`), the registry is a real SQLite one; the interleavings are forced with the crash
points of `orchestrator.core.crashpoints` (a hook runs another verb between two side effects of
the first, or the first "dies" there) or with a barrier in front of a step.
"""

from __future__ import annotations

from pathlib import Path
import re
import threading

import psutil
import pytest

from control_helpers import ALIAS, PIPELINE, allocate, end_children, profiles, wait_for, write_table
from orchestrator.core import crashpoints
from orchestrator.core.exceptions import ConflictError, KappaError, LifecycleError, NotReadyError
from orchestrator.jobctl import inspect_version, launch, start_version
from orchestrator.jobctl.health import CHILDREN
from orchestrator.lifecycle import monitor as monitor_mod
from orchestrator.lifecycle import promote as promote_mod
from orchestrator.lifecycle.monitor import monitor
from orchestrator.lifecycle.promote import flip, promote
from orchestrator.lifecycle.reconcile import reconcile
from orchestrator.lifecycle.retire import retire
from orchestrator.lifecycle.rollback import finish_rollback, prepare_rollback, rollback
from orchestrator.serving import resolve_alias

ROWS = [("m1", "swe", "SWE", "Ada", 1), ("m2", "sr swe", "Sr SWE", "Alan", 2), ("m3", "pm", "PM", "Grace", 3)]


@pytest.fixture(autouse=True)
def _disarm():
    crashpoints.disarm()
    yield
    crashpoints.disarm()


def running(k, fake_log, state="caught_up") -> int:
    """A version whose fake job process runs, in `state`, with a table and lag samples at 0."""
    v = allocate(k).version
    start_version(k.version(PIPELINE, v), actor="t")
    wait_for(lambda: inspect_version(k.version(PIPELINE, v)).health == "running", 15, f"the fake job of v{v} to run")
    if state != "starting":
        k.registry.set_state(PIPELINE, v, state, expected="starting")
    fake_log.read_all()
    write_table(k.paths(PIPELINE, v).table, profiles(ROWS))
    for batches in (1, 2, 3):   # a micro-batch apart, after the job's first: the fake job counts on from there
        k.registry.add_lag_sample(PIPELINE, v, 0, {}, lag_seconds=0.0, batches=batches)
    return v


def serving_pair(k, fake_log) -> tuple[int, int]:
    """v1 promoted, then v2 promoted over it: v2 serves, v1 is standby (its job still runs)."""
    v1 = running(k, fake_log)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = running(k, fake_log)
    promote(k.version(PIPELINE, v2), actor="alice", reason="second")
    return v1, v2


def states(k) -> dict[int, str]:
    return {r.version: r.state for r in k.registry.list_versions(PIPELINE)}


def alive_jobs() -> list[int]:
    return [pid for pid, p in CHILDREN.items() if p.poll() is None]


def test_case1_two_starts_of_one_version_start_one_job(k, fake_jobs, monkeypatch):
    """Both starts pass the "already running?" check before either spawns: one job, one no-op."""
    v = allocate(k).version
    barrier = threading.Barrier(2, timeout=30)
    real = launch.inspect_version
    waited: set[int] = set()

    def inspect_then_wait(*a, **kw):
        st = real(*a, **kw)
        if threading.get_ident() not in waited:
            waited.add(threading.get_ident())
            barrier.wait()  # both have seen "not running" before either goes on
        return st

    monkeypatch.setattr(launch, "inspect_version", inspect_then_wait)
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(start_version(k.version(PIPELINE, v), actor=f"op{i}")))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.started for r in results) == [False, True]
    noop = next(r for r in results if not r.started)
    assert "is being started by op" in noop.message and "not starting a second job" in noop.message
    assert len(alive_jobs()) == 1
    assert k.registry.get_version(PIPELINE, v).lease_owner is None  # released by the winner


def test_a_start_that_lands_between_another_start_s_check_and_its_lease_is_not_doubled(k, fake_log, fake_jobs,
                                                                                      monkeypatch):
    """The stress test's StrayJob (2 jobs for v2): two supervisors restart a dead job of a version whose
    state a start keeps (starting, here). The second checked "is it running?" before the first took the
    lease, and took the lease after the first had spawned its job and released it: the state was the
    one it expected, so its compare-and-swap passed and it spawned a second job. The check is made again
    under the lease now."""
    v = running(k, fake_log, state="starting")
    ref = k.version(PIPELINE, v)
    dead = inspect_version(ref).pid
    CHILDREN[dead].kill()
    CHILDREN[dead].wait(10)
    assert not inspect_version(ref).alive
    real = launch.inspect_version
    other: list = []

    def the_other_start_lands_meanwhile(*a, **kw):
        st = real(*a, **kw)
        if not other:                          # the first check of the first start: the job is dead
            monkeypatch.setattr(launch, "inspect_version", real)
            other.append(start_version(ref, actor="monitor", check_exit_seconds=0))
        return st

    monkeypatch.setattr(launch, "inspect_version", the_other_start_lands_meanwhile)
    res = start_version(ref, actor="reconcile", check_exit_seconds=0)
    assert other[0].started and not res.started
    assert res.message == (f"{PIPELINE} v{v} was started by another operation meanwhile (pid {other[0].pid}); "
                           f"not starting a second job")
    assert alive_jobs() == [other[0].pid]
    rec = k.registry.get_version(PIPELINE, v)
    assert (rec.state, rec.pid, rec.lease_owner) == ("starting", other[0].pid, None)
    end_children()


def test_case2_no_flip_lands_on_a_version_being_retired(k, fake_log, fake_jobs, monkeypatch):
    monkeypatch.setattr("orchestrator.lifecycle.retire._delete_group", lambda k, g: "deleted")
    v1, v2 = serving_pair(k, fake_log)
    v3 = running(k, fake_log)
    promote(k.version(PIPELINE, v3), actor="alice", reason="third")      # v3 serves, v2 standby, v1 standby
    k.registry.set_state(PIPELINE, v1, "stopped", expected="standby")
    outcome: dict = {}

    def rollback_to_v1():
        try:
            flip(k.version(PIPELINE, v1), expected_version=v3, actor="bob", reason="race", action="rollback")
        except KappaError as e:
            outcome["error"] = e

    crashpoints.hook("retire.marked", rollback_to_v1)
    retire(k.version(PIPELINE, v1), actor="cron", reason="old")
    assert isinstance(outcome.get("error"), (NotReadyError, ConflictError))
    assert k.registry.get_alias(ALIAS).version == v3
    assert states(k)[v1] == "retired"
    # and the registry itself refuses a retiring target, whatever the caller checked before
    v4 = allocate(k).version
    k.registry.set_state(PIPELINE, v4, "stopped")
    k.registry.begin_retire(PIPELINE, v4, actor="cron", reason="old")
    with pytest.raises(ConflictError, match="is retiring"):
        k.registry.flip_alias(ALIAS, PIPELINE, expected_version=v3, new_version=v4, actor="bob", reason="r")


def test_case3_standby_stop_loses_to_a_rollback_that_landed_first(k, fake_log, fake_jobs, monkeypatch):
    v1, v2 = serving_pair(k, fake_log)
    real = monitor_mod.standby_expired

    def rollback_lands_then_expired(v, now=None):
        rollback(k, k.pipeline(PIPELINE), actor="bob", reason="v2 is bad", poll_seconds=0.01, deadline_seconds=10)
        return 1.0  # the grace period is over, as the monitor's snapshot says

    monkeypatch.setattr(monitor_mod, "standby_expired", rollback_lands_then_expired)
    report = monitor(k, actor="cron", raise_on_problem=False)
    assert report.stopped == []
    assert k.registry.get_alias(ALIAS).version == v1
    assert (states(k)[v1], states(k)[v2]) == ("serving", "standby")
    assert inspect_version(k.version(PIPELINE, v1)).alive
    assert real is not None


def test_case3_rollback_after_the_standby_was_marked_stopped_is_refused(k, fake_log, fake_jobs, monkeypatch):
    v1, v2 = serving_pair(k, fake_log)
    outcome: dict = {}

    def rollback_now():
        try:
            plan = prepare_rollback(k, k.pipeline(PIPELINE), actor="bob", reason="v2 is bad")
            finish_rollback(k, plan, actor="bob", poll_seconds=0.01, deadline_seconds=0.5)
        except KappaError as e:
            outcome["error"] = e

    crashpoints.hook("stop.marked", rollback_now)
    monkeypatch.setattr(monitor_mod, "standby_expired", lambda *a, **kw: 1.0)
    monitor(k, actor="cron", raise_on_problem=False)
    # v1 was marked stopped before its job was signalled; the rollback then saw it stopped and
    # either restarted it (lease held by the monitor's stop -> no-op) or was refused: never a flip
    # to a job being stopped, and never "stopped" written over "serving".
    alias = k.registry.get_alias(ALIAS)
    assert alias.version == v2 and states(k)[v2] == "serving"
    assert states(k)[v1] != "serving"
    assert "error" in outcome


def _stop_under_way(k, fake_log, fake_jobs):
    """v2 serves, v1 is a standby whose job takes its time to stop (`slow-stop`, held by a HOLD file)."""
    fake_jobs[1] = "slow-stop"
    v1, v2 = serving_pair(k, fake_log)
    assert v1 == 1
    Path(k.paths(PIPELINE, v1).checkpoint).mkdir(parents=True, exist_ok=True)
    hold = k.paths(PIPELINE, v1).run_dir / "HOLD"
    hold.touch()
    return v1, v2, hold


def test_case3_rollback_during_a_standby_stop_waits_for_it(k, fake_log, fake_jobs, monkeypatch):
    """Issue 22, item 9: the history listed the rollback's `start` of v1 before the earlier `stop` of v1.
    The monitor's standby stop had written `stop_requested` and the STOP file and was waiting for the
    job to end; a rollback saw v1 alive but stopped, restarted it (stopping the same job itself) and
    audited `start`; the monitor's `stop` came after. Forced here: v1's job stays alive (HOLD) until
    the rollback has seen it, and the monitor audits its `stop` only once the rollback is either done
    (the bug) or waiting for that stop (the fix)."""
    from orchestrator.lifecycle import rollback as rollback_mod

    v1, v2, hold = _stop_under_way(k, fake_log, fake_jobs)
    monkeypatch.setattr(monitor_mod, "standby_expired", lambda v, now=None: 1.0 if v.version == v1 else None)
    rollback_ready = threading.Event()
    crashpoints.hook("rollback.awaiting_stop", rollback_ready.set)
    real_inspect, real_audit = rollback_mod.inspect_version, k.registry.audit
    seen: list = []

    def inspect_then_release(v):
        st = real_inspect(v)
        if v.version == v1 and not seen:
            seen.append(st.alive)
            hold.unlink()                 # the rollback has seen v1's job alive: now it may end
        return st

    def audit_after_the_rollback(action, *, actor, **kw):
        if action == "stop" and actor == "cron":
            assert rollback_ready.wait(30), "the rollback neither finished nor waited for the stop"
        return real_audit(action, actor=actor, **kw)

    monkeypatch.setattr(rollback_mod, "inspect_version", inspect_then_release)
    monkeypatch.setattr(k.registry, "audit", audit_after_the_rollback)
    cron = threading.Thread(target=lambda: monitor(k, actor="cron", raise_on_problem=False))
    cron.start()
    try:
        wait_for(lambda: k.paths(PIPELINE, v1).stop_file.exists(), 15, "the monitor's STOP file of v1")
        plan = prepare_rollback(k, k.pipeline(PIPELINE), actor="bob", reason="v2 is bad")
        rollback_ready.set()
        finish_rollback(k, plan, actor="bob", poll_seconds=0.01, deadline_seconds=15)
    finally:
        rollback_ready.set()
        hold.unlink(missing_ok=True)
        cron.join(60)
    assert seen == [True]
    entries = [(e.action, e.actor) for e in k.registry.audit_log(PIPELINE, limit=None, version=v1)]
    assert ("stop", "bob") not in entries
    assert entries.index(("stop", "cron")) < entries.index(("start", "bob")), entries
    stop = next(e for e in k.registry.audit_log(PIPELINE, limit=None, version=v1, action="stop") if e.actor == "cron")
    start = k.registry.audit_log(PIPELINE, version=v1, action="start")[-1]
    assert stop.details["ended_at"] <= stop.at and stop.details["ended_at"] <= start.at  # when the job had ended
    assert re.search(rf"^{PIPELINE} v{v1} was stopped at [0-9:]+ UTC by cron \(grace period over; this "
                     r"rollback waited [0-9.]+ s for that stop to end\): restarting it from its checkpoint", plan.message), \
        plan.message
    assert k.registry.get_alias(ALIAS).version == v1
    assert states(k)[v1] == "serving" and inspect_version(k.version(PIPELINE, v1)).alive


def test_case3_a_rollback_refuses_when_the_stop_under_way_does_not_end_in_time(k, fake_log, fake_jobs):
    """The wait for someone else's stop is bounded: past it, the rollback is refused in one line and
    the current version keeps serving."""
    from orchestrator.jobctl import stop_version

    v1, v2, hold = _stop_under_way(k, fake_log, fake_jobs)
    cron = threading.Thread(target=lambda: stop_version(k.version(PIPELINE, v1), actor="cron", expected_state="standby",
                                                        reason="standby grace period of 0 s is over"))
    cron.start()
    try:
        wait_for(lambda: k.paths(PIPELINE, v1).stop_file.exists(), 15, "the STOP file of v1")
        with pytest.raises(LifecycleError) as e:
            prepare_rollback(k, k.pipeline(PIPELINE), actor="bob", reason="v2 is bad", stop_wait_seconds=0.3)
    finally:
        hold.unlink(missing_ok=True)
        cron.join(60)
    assert str(e.value) == (f"cannot roll back alias {ALIAS!r} to {PIPELINE} v{v1} now: v{v1} is still being "
                            f"stopped by cron; retry the rollback (v{v2} keeps serving)")
    assert "\n" not in str(e.value)
    assert k.registry.get_alias(ALIAS).version == v2
    actions = [(e.action, e.actor) for e in k.registry.audit_log(PIPELINE, limit=None, version=v1)]
    assert ("start_requested", "bob") not in actions and ("stop", "bob") not in actions


def test_case4_two_promotes_in_a_row_leave_exactly_one_serving(k, fake_log, fake_jobs):
    v1 = running(k, fake_log)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2, v3 = running(k, fake_log), running(k, fake_log)
    ran: list = []

    def second_promote():
        ran.append(promote(k.version(PIPELINE, v3), actor="bob", reason="right after"))

    crashpoints.hook("promote.flipped", second_promote)
    promote(k.version(PIPELINE, v2), actor="alice", reason="first of two")
    assert ran and k.registry.get_alias(ALIAS).version == v3
    st = states(k)
    assert [v for v, s in st.items() if s == "serving"] == [v3]
    assert (st[v1], st[v2]) == ("standby", "standby")


def test_case5_promote_refuses_a_job_that_died_after_the_checks(k, fake_log, fake_jobs, monkeypatch):
    v1 = running(k, fake_log)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = running(k, fake_log)
    real_checks = promote_mod._checks

    def checks_then_job_dies(*a, **kw):
        out = real_checks(*a, **kw)
        pid = inspect_version(k.version(PIPELINE, v2)).pid
        psutil.Process(pid).kill()
        wait_for(lambda: not inspect_version(k.version(PIPELINE, v2)).alive, 10, "the job of v2 to die")
        return out

    monkeypatch.setattr(promote_mod, "_checks", checks_then_job_dies)
    with pytest.raises(NotReadyError, match=f"promote of {PIPELINE} v{v2} refused at flip time"):
        promote(k.version(PIPELINE, v2), actor="alice", reason="second")
    assert k.registry.get_alias(ALIAS).version == v1
    rec = k.registry.get_version(PIPELINE, v2)
    assert rec.state == "failed" and "exited" in rec.error  # its error recorded, not erased


@pytest.mark.parametrize("point", ["promote.flipped", "promote.published"])
def test_case6_a_crash_after_the_swap_leaves_the_states_right(k, fake_log, fake_jobs, point):
    v1 = running(k, fake_log)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = running(k, fake_log)
    with crashpoints.armed_at(point), pytest.raises(crashpoints.KappaCrashed):
        promote(k.version(PIPELINE, v2), actor="bob", reason="crash")
    assert (states(k)[v1], states(k)[v2]) == ("standby", "serving")  # without any repair
    reconcile(k, actor="cron")
    assert resolve_alias(ALIAS, k.settings)["version"] == v2
    assert promote(k.version(PIPELINE, v2), actor="bob", reason="retry").flipped is False


def test_case7_a_rollback_that_times_out_stops_the_job_it_restarted(k, fake_log, fake_jobs):
    v1, v2 = serving_pair(k, fake_log)
    k.registry.set_state(PIPELINE, v1, "standby", expected="standby")
    from orchestrator.jobctl import stop_version

    stop_version(k.version(PIPELINE, v1), actor="cron", expected_state="standby")
    Path(k.paths(PIPELINE, v1).checkpoint).mkdir(parents=True, exist_ok=True)
    fake_log.ends = {tp: end + 10**6 for tp, end in fake_log.ends.items()}  # the log grew: it lags
    with pytest.raises(NotReadyError, match="stopped before the flip"):
        rollback(k, k.pipeline(PIPELINE), actor="bob", reason="v2 is bad", poll_seconds=0.01, deadline_seconds=0.3)
    assert k.registry.get_alias(ALIAS).version == v2
    assert not inspect_version(k.version(PIPELINE, v1)).alive
    assert states(k)[v1] == "stopped"
    assert [e.reason for e in k.registry.audit_log(PIPELINE, action="stop")][-1].startswith(
        f"rollback of alias '{ALIAS}' to v{v1} abandoned")


def test_case8_reconcile_does_not_kill_a_job_being_started(k, fake_log, fake_jobs):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "stopped")
    seen: list = []
    crashpoints.hook("start.launched", lambda: seen.append(reconcile(k, actor="monitor")))
    res = start_version(k.version(PIPELINE, v), actor="rollback")
    assert seen == [[]]                      # the lease kept reconcile off it
    assert res.started and inspect_version(k.version(PIPELINE, v)).alive
    assert states(k)[v] == "starting"


def test_case11_a_promote_that_lands_while_a_rollback_waits_is_not_undone(k, fake_log, fake_jobs):
    v1, v2 = serving_pair(k, fake_log)
    plan = prepare_rollback(k, k.pipeline(PIPELINE), actor="airflow:bob", reason="v2 is bad")
    v3 = running(k, fake_log)
    promote(k.version(PIPELINE, v3), actor="alice", reason="lands while the rollback waits")
    with pytest.raises(ConflictError, match="lost the race"):
        finish_rollback(k, plan, actor="airflow:bob", poll_seconds=0.01, deadline_seconds=5)
    assert k.registry.get_alias(ALIAS).version == v3


def test_case11_the_airflow_rollback_task_expects_the_alias_where_prepare_found_it(k, fake_log, fake_jobs,
                                                                                 monkeypatch):
    """The DAG's flip task re-ran the whole verb, which re-read the alias: a promote that landed
    while the sensor waited was silently undone."""
    import time
    from contextlib import nullcontext

    from orchestrator.airflow import tasks

    monkeypatch.setattr(tasks, "task_kappa", lambda: nullcontext(k))
    v1, v2 = serving_pair(k, fake_log)
    prepared = tasks.prepare_rollback(PIPELINE, None, "v2 is bad", user="bob", run_id="manual__1")
    v3 = running(k, fake_log)
    promote(k.version(PIPELINE, v3), actor="alice", reason="lands while the rollback waits")
    with pytest.raises(ConflictError, match="lost the race"):
        tasks.rollback(prepared, "v2 is bad", deadline_at=time.time() + 5, user="bob", run_id="manual__1")
    assert k.registry.get_alias(ALIAS).version == v3
    assert resolve_alias(ALIAS, k.settings)["version"] == v3


def test_case15_a_start_cut_off_before_the_launch_is_not_stuck(k, fake_log, fake_jobs, monkeypatch):
    v = allocate(k).version
    with crashpoints.armed_at("start.leased"), pytest.raises(crashpoints.KappaCrashed):
        start_version(k.version(PIPELINE, v), actor="deployer")
    rec = k.registry.get_version(PIPELINE, v)
    assert rec.state == "starting" and rec.lease_held()
    assert reconcile(k, actor="cron") == []          # its lease is fresh: someone may still be starting it
    k.registry.take_lease(PIPELINE, v, owner=rec.lease_owner, expected=("starting",), ttl=-1)  # it expires
    (action,) = reconcile(k, actor="cron")
    assert action["kind"] in ("mark_failed", "restart")
    assert states(k)[v] != "created"
    end_children()


def test_a_flip_between_the_state_repair_s_alias_read_and_its_move_is_not_undone(k, fake_jobs, fake_log, monkeypatch):
    """The stress test's TwoServing [1, 7]: `set_serving_states` (a noop promote, a finished interrupted
    flip, reconcile) read the alias on v2; a rollback flipped it to v1 (v1 serving, v2 standby) before
    the repair moved v2 from standby to serving, and two versions served. The repair's move now checks
    the alias in its own transaction and leaves the rollback's states alone."""
    from orchestrator.serving import set_serving_states

    v1, v2 = serving_pair(k, fake_log)
    reg = k.registry
    real_get_version = reg.get_version
    flipped = []

    def rollback_lands_first(pipeline, n):
        if n == v2 and not flipped:          # right after the repair read the alias, before its move
            reg.flip_alias(ALIAS, PIPELINE, expected_version=v2, new_version=v1, actor="bob", reason="rollback",
                           serve=True, action="rollback")
            flipped.append(v1)
        return real_get_version(pipeline, n)

    monkeypatch.setattr(reg, "get_version", rollback_lands_first)
    set_serving_states(k, k.pipeline(PIPELINE), v2, v1)
    assert flipped == [v1]
    states = {r.version: r.state for r in reg.list_versions(PIPELINE)}
    assert (states[v1], states[v2]) == ("serving", "standby"), states
    assert [v for v, s in states.items() if s == "serving"] == [v1] == [reg.get_alias(ALIAS).version]
