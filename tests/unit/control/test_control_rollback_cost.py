"""What a rollback costs, said before it starts (issue 22, item 5).

While the target is a running standby the flip is instant; after its grace period its job was
stopped, and the rollback restarts it from its checkpoint: the plan's estimate counts the records it
has to catch up (the fake log's end minus its checkpoint), names when and by whom it was stopped and
how long the last such restart took, and its message says so. The jobs are fake job processes.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from control_helpers import ALIAS, PIPELINE, TOPIC, allocate, profiles, wait_for, write_table
from orchestrator.jobctl import inspect_version, start_version, stop_version
from orchestrator.core.exceptions import ConfigError, NotReadyError
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.rollback import finish_rollback, prepare_rollback, restart_progress_line, rollback

ROWS = [("m1", "swe", "SWE", "Ada", 1), ("m2", "pm", "PM", "Grace", 2)]
NOON = 1_750_000_000.0          # 2025-06-15 15:06:40 UTC


def _running(k, fake_log) -> int:
    v = allocate(k).version
    start_version(k.version(PIPELINE, v), actor="t")
    wait_for(lambda: inspect_version(k.version(PIPELINE, v)).health == "running", 15, f"the fake job of v{v} to run")
    k.registry.set_state(PIPELINE, v, "caught_up", expected="starting")
    fake_log.read_all()
    write_table(k.paths(PIPELINE, v).table, profiles(ROWS))
    for batches in (1, 2, 3):
        k.registry.add_lag_sample(PIPELINE, v, 0, {}, lag_seconds=0.0, batches=batches)
    return v


@pytest.fixture
def pair(k, fake_log, fake_jobs):
    """v2 serves, v1 is a running standby with a checkpoint."""
    v1 = _running(k, fake_log)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = _running(k, fake_log)
    promote(k.version(PIPELINE, v2), actor="alice", reason="second")
    Path(k.paths(PIPELINE, v1).checkpoint).mkdir(parents=True, exist_ok=True)
    return v1, v2


def _stop_standby(k, fake_log, v1: int) -> None:
    """The grace period is over: v1 is stopped, and the log grows by 1,240 records since its checkpoint."""
    stop_version(k.version(PIPELINE, v1), actor="kappa-monitor", expected_state="standby",
                 reason="standby grace period of 300 s is over [airflow kappa_monitor run scheduled__1]")
    fake_log.ends = {(TOPIC, 0): fake_log.ends[(TOPIC, 0)] + 1000, (TOPIC, 1): fake_log.ends[(TOPIC, 1)] + 240}


def test_a_rollback_to_a_running_standby_says_the_flip_is_instant(k, fake_log, pair):
    v1, v2 = pair
    plan = prepare_rollback(k, k.pipeline(PIPELINE), actor="bob", reason="v2 is bad")
    until = k.registry.get_version(PIPELINE, v1).details["standby_until"]
    assert plan.message.startswith(f"{PIPELINE} v{v1} still runs as a standby: the flip is instant (until ")
    assert plan.message.endswith(" UTC, when its grace period ends)")
    assert not plan.restarted and plan.estimate.restart is False and plan.estimate.records_behind is None
    assert plan.estimate.standby_until == until
    assert plan.restarted_at is None


def test_a_standby_past_its_grace_period_not_stopped_yet_says_so(k, fake_log, fake_jobs):
    v1 = _running(k, fake_log)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = _running(k, fake_log)
    promote(k.version(PIPELINE, v2), actor="alice", reason="second", grace_seconds=0)
    plan = prepare_rollback(k, k.pipeline(PIPELINE), actor="bob")
    assert re.fullmatch(rf"{PIPELINE} v{v1} still runs as a standby: the flip is instant \(its grace period ended at "
                        r"[0-9: -]+ UTC: the monitor stops it at its next pass\)", plan.message), plan.message


def test_a_rollback_to_a_stopped_version_says_it_restarts_it_and_how_far_behind_it_is(k, fake_log, pair):
    v1, v2 = pair
    _stop_standby(k, fake_log, v1)
    stop = k.registry.audit_log(PIPELINE, action="stop", version=v1)[-1]
    plan = prepare_rollback(k, k.pipeline(PIPELINE), actor="bob", reason="v2 is bad")
    est = plan.estimate
    assert plan.restarted and est.restart
    assert est.records_behind == 1240 == sum(fake_log.ends.values()) - sum(fake_log.checkpoint.values())
    assert (est.stopped_at, est.stopped_by, est.last_restart_seconds) == (stop.at, "kappa-monitor", None)
    assert re.fullmatch(rf"{PIPELINE} v{v1} was stopped at \d\d:\d\d:\d\d UTC by kappa-monitor \(grace period over\): "
                        rf"restarting it from its checkpoint, 1,240 records to catch up\. v{v2} serves until the "
                        rf"flip\.", plan.message), plan.message
    assert k.registry.get_alias(ALIAS).version == v2          # the first half flips nothing
    fake_log.read_all()                                        # it catches up
    res = finish_rollback(k, plan, actor="bob", reason="v2 is bad", poll_seconds=0.01, deadline_seconds=15)
    assert res.flipped and res.restarted
    assert re.fullmatch(rf"rolled back alias '{ALIAS}' from v{v2} to v{v1} \(restarted from its checkpoint, caught up "
                        rf"in \d+ s\)", res.message), res.message
    flip = k.registry.audit_log(PIPELINE, action="rollback")[-1]
    assert flip.details["restart_seconds"] >= flip.details["waited_seconds"] > 0

    # forward to v2 again (v1 runs: instant), v1's grace period ends, and a second rollback knows the first's cost
    assert rollback(k, k.pipeline(PIPELINE), v2, actor="bob", reason="fixed", poll_seconds=0.01).flipped
    _stop_standby(k, fake_log, v1)
    again = prepare_rollback(k, k.pipeline(PIPELINE), actor="bob", reason="v2 is bad again")
    assert again.estimate.last_restart_seconds == flip.details["restart_seconds"]
    assert again.estimate.records_behind == 1240
    assert f"; the last such restart took {round(flip.details['restart_seconds'])} s. v{v2} serves until the flip." \
        in again.message


def test_a_restarted_target_runs_at_full_share_however_far_behind_the_serving_version_is(k, fake_log, pair):
    """CI, 2026-11-30: `kappa up`'s rollback restarted v1 while v2, the version being rolled back from, was
    54 s behind on a loaded machine; the adaptive controller took that for a reason to slow v1 down, to
    nice 19, and its first micro-batch took 184 s. The target is restarted at a fixed full share, audited,
    and the controller's passes leave it there until it serves."""
    from orchestrator.lifecycle.throttle import current_throttle, full_share_until_it_serves, throttle_pass

    v1, v2 = pair
    k.registry.update_throttle(PIPELINE, v1, expected_changed_at=None, throttle={   # from its own backfill
        "share": 1.0, "mode": "adaptive", "changed_at": NOON - 3600, "by": "supervise", "why": "w"})
    _stop_standby(k, fake_log, v1)
    plan = prepare_rollback(k, k.pipeline(PIPELINE), actor="bob", reason="v2 is bad")
    assert plan.restarted
    t = current_throttle(k.version(PIPELINE, v1))
    assert (t["share"], t["mode"], t["by"]) == (1.0, "fixed", "bob"), t
    (e,) = k.registry.audit_log(PIPELINE, version=v1, action="throttle")
    assert e.reason == f"rollback of alias '{ALIAS}' to v{v1}: v2 is bad: the rollback's target runs at full share"
    assert (e.details["from_mode"], e.details["mode"]) == ("adaptive", "fixed")
    for i in range(4):                       # v2 serves far over the bound: passes a controller interval apart
        k.registry.add_lag_sample(PIPELINE, v2, 900, {}, lag_seconds=300.0, at=NOON + 10 * i)
        assert throttle_pass(k, k.pipeline(PIPELINE), actor="supervise", serving=v2, now=NOON + 10 * i) == []
    assert current_throttle(k.version(PIPELINE, v1))["share"] == 1.0
    full_share_until_it_serves(k.version(PIPELINE, v1), actor="carol", why="again")      # so already: no change
    assert len(k.registry.audit_log(PIPELINE, version=v1, action="throttle")) == 1


def test_a_restarted_target_not_caught_up_by_the_deadline_is_not_flipped_to_unless_forced(k, fake_log, pair):
    v1, v2 = pair
    _stop_standby(k, fake_log, v1)                             # 1,240 records behind; it does not catch up here
    with pytest.raises(NotReadyError) as e:
        rollback(k, k.pipeline(PIPELINE), actor="bob", reason="v2 is bad", poll_seconds=0.01, deadline_seconds=0.3)
    msg = str(e.value)
    assert msg.startswith(f"rollback of alias '{ALIAS}' to {PIPELINE} v{v1} stopped before the flip (v{v2} still "
                          f"serves): {PIPELINE} v{v1} is not ready after 0 s"), msg
    assert "total lag 1,240 records" in msg
    assert msg.endswith("Raise the deadline (--deadline, the form's catch-up deadline; it was 0 s), or flip anyway "
                        "with --force and a reason (audited).")
    assert k.registry.get_alias(ALIAS).version == v2 and not inspect_version(k.version(PIPELINE, v1)).alive
    failed = k.registry.audit_log(PIPELINE, action="rollback")[-1]
    assert (failed.outcome, failed.details["readiness"]["lag"]) == ("failed", 1240)
    with pytest.raises(ConfigError, match=r"rollback of .* with --force needs a reason"):
        rollback(k, k.pipeline(PIPELINE), actor="bob", force=True)
    res = rollback(k, k.pipeline(PIPELINE), actor="bob", reason="v2 is worse", force=True, poll_seconds=0.01, deadline_seconds=0.3)
    assert (res.flipped, res.forced, k.registry.get_alias(ALIAS).version) == (True, True, v1)
    assert res.message.startswith(f"rolled back alias '{ALIAS}' from v{v2} to v{v1} at the deadline although v{v1} had "
                                  f"not caught up (--force): {PIPELINE} v{v1}: "), res.message
    flip = k.registry.audit_log(PIPELINE, action="rollback")[-1]
    assert (flip.outcome, flip.reason, flip.details["forced"]) == ("ok", "v2 is worse", ["ready"])
    assert flip.details["readiness"]["lag"] == 1240 and flip.details["readiness"]["rule"].startswith("lag <= 0 records")


def test_an_unknown_lag_is_said_to_be_unknown_not_zero(k, fake_log, pair):
    v1, v2 = pair
    _stop_standby(k, fake_log, v1)
    fake_log.down = True
    plan = prepare_rollback(k, k.pipeline(PIPELINE), actor="bob")
    assert plan.estimate.records_behind is None and "cannot read log end offsets" in plan.estimate.lag_error
    assert "restarting it from its checkpoint, records to catch up unknown (cannot read log end offsets" in plan.message


def test_a_version_started_since_its_last_stop_is_not_said_to_be_stopped(k, fake_log, pair):
    """v1 stopped, started again, then its job died: the old stop does not explain why it is down."""
    v1, v2 = pair
    _stop_standby(k, fake_log, v1)
    pid = start_version(k.version(PIPELINE, v1), actor="alice").pid
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not inspect_version(k.version(PIPELINE, v1)).alive, 15, f"the job of v{v1} to die")
    plan = prepare_rollback(k, k.pipeline(PIPELINE), actor="bob")
    assert plan.estimate.stopped_at is None
    assert plan.message.startswith(f"{PIPELINE} v{v1} is not running (it is starting): restarting it from its "
                                   f"checkpoint, ")


@pytest.mark.parametrize("args, kw, line", [
    ((1, None), {"job_health": "starting"}, "restarting v1: job starting..."),
    ((1, None), {"job_health": "running"}, "restarting v1: job running, lag not known yet"),
    ((1, 1240), {}, "restarting v1: lag 1,240 records"),
    ((1, 1), {}, "restarting v1: lag 1 record"),
    ((1, 312), {"rate": 40.2, "eta_seconds": 8.0, "now": NOON},
     "restarting v1: lag 312 records (40 records/s), ETA 8 s (15:06:48 UTC)"),
    ((3, 90_000), {"eta_seconds": 450.0, "job_health": "running", "now": NOON},
     "restarting v3: lag 90,000 records, ETA 7.5 min (15:14:10 UTC)"),
])
def test_the_progress_line(args, kw, line):
    assert restart_progress_line(*args, **kw) == line


def test_a_rollback_to_a_running_standby_with_the_broker_unreachable_refuses_at_once_or_flips_when_forced(
        k, fake_log, pair):
    """Issue 33: the standby's lag cannot be read (the broker unreachable). The rollback neither waits
    until its deadline nor touches the standby's job: it refuses after the first sample, in one line that
    says why and that --force flips anyway; --force flips at once, audited as forced."""
    v1, v2 = pair
    job = inspect_version(k.version(PIPELINE, v1)).pid
    fake_log.down = True
    samples = []
    with pytest.raises(NotReadyError) as e:
        rollback(k, k.pipeline(PIPELINE), actor="bob", reason="v2 is bad", poll_seconds=0.01, deadline_seconds=5,
                 on_sample=samples.append)
    msg = str(e.value)
    assert len(samples) == 1, f"the rollback kept waiting on an unknown lag: {len(samples)} samples; {msg}"
    assert "\n" not in msg, msg
    assert msg.startswith(f"rollback of alias '{ALIAS}' to {PIPELINE} v{v1} refused (v{v2} still serves): the lag "
                          f"of v{v1} is unknown because the Kafka broker is unreachable (cannot read log end "), msg
    assert msg.endswith("; retry once the broker is back, or flip now with --force and a reason (audited)."), msg
    assert k.registry.get_alias(ALIAS).version == v2
    assert str(k.registry.get_version(PIPELINE, v1).state) == "standby"
    assert inspect_version(k.version(PIPELINE, v1)).pid == job, "the refused rollback touched the standby's job"
    failed = k.registry.audit_log(PIPELINE, action="rollback")[-1]
    assert (failed.outcome, failed.details["readiness"]["lag"]) == ("failed", None)

    samples.clear()
    res = rollback(k, k.pipeline(PIPELINE), actor="bob", reason="v2 is bad, broker or not", force=True,
                   poll_seconds=0.01, deadline_seconds=5, on_sample=samples.append)
    assert len(samples) == 1 and (res.flipped, res.forced) == (True, True), (samples, res)
    assert res.message.startswith(f"rolled back alias '{ALIAS}' from v{v2} to v{v1} although the lag of v{v1} is "
                                  f"unknown (the Kafka broker is unreachable; --force)"), res.message
    assert (k.registry.get_alias(ALIAS).version, k.registry.get_alias(ALIAS).published_version) == (v1, v1)
    flip = k.registry.audit_log(PIPELINE, action="rollback")[-1]
    assert (flip.outcome, flip.details["forced"], flip.details["readiness"]["lag"]) == ("ok", ["ready"], None)
    assert inspect_version(k.version(PIPELINE, v1)).pid == job
    assert not k.registry.audit_log(PIPELINE, action="stop", version=v1)
