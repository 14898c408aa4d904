"""Monitor: standbys stopped after their grace period (to the second), serving failures and sustained
lag raised. The flip benchmark is judged in test_control_flipbench."""

from __future__ import annotations

import pytest

from control_helpers import (ALIAS, PIPELINE, Clock, allocate, fake_running, make_spec, profiles, ready_version,
                             wait_for, write_table)
from orchestrator import serving
from orchestrator.context import Kappa
from orchestrator.core.exceptions import LifecycleError, NotReadyError
from orchestrator.jobctl import inspect_version, start_version
from orchestrator.lifecycle import monitor as monitor_mod
from orchestrator.lifecycle.monitor import monitor
from orchestrator.lifecycle.promote import promote
from orchestrator.serving import publish_current, set_serving_states


def _serving_pair(k, fake_log):
    v1, v2 = allocate(k).version, allocate(k).version
    for v in (v1, v2):
        fake_running(k, v)
    fake_log.read_all()
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v1, actor="t", reason="r")
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=v1, new_version=v2, actor="t", reason="r")
    k.registry.set_state(PIPELINE, v2, "serving")
    k.registry.set_state(PIPELINE, v1, "standby", details={"standby_since": 9e12})  # grace not over
    publish_current(k, ALIAS)
    return v1, v2


def test_monitor_stops_a_standby_past_its_grace_period(k, fake_log, fake_jobs):
    v1, v2 = _serving_pair(k, fake_log)
    k.paths(PIPELINE, v1).launch_file.unlink()
    k.paths(PIPELINE, v1).status_file.unlink()
    start_version(k.version(PIPELINE, v1), actor="t")  # a real (fake) process to stop
    k.registry.set_state(PIPELINE, v1, "standby", details={"standby_since": 0.0})
    report = monitor(k, actor="cron")
    assert [(s["version"], s["how"]) for s in report.stopped] == [(v1, "graceful")], report.errors
    assert k.registry.get_version(PIPELINE, v1).state == "stopped"
    assert inspect_version(k.version(PIPELINE, v1)).health == "stopped"
    assert report.problems == []
    assert {v["version"] for v in report.versions} == {v1, v2}
    # what the kappa_monitor task and `kappa monitor` print: one line in words per thing done or found
    lines = monitor_mod.report_lines(report)
    (stop_line,) = [line for line in lines if line.startswith("standby grace period over: ")]
    assert stop_line.startswith(f"standby grace period over: stopped {PIPELINE} v{v1} (pid {report.stopped[0]['pid']}) "
                                f"in ") and ", within its bound of 60 s (" in stop_line, stop_line
    assert [line.split(":")[0] for line in lines if line.startswith(PIPELINE)] == \
        [f"{PIPELINE} v{v1} (standby)", f"{PIPELINE} v{v2} (serving)"]
    assert not any(line.lstrip().startswith(("{", "[")) for line in lines)        # no raw JSON


def test_a_monitor_pass_with_nothing_to_do_says_so_and_the_watch_says_nothing_is_watched(k):
    assert monitor_mod.report_lines(monitor(k, actor="cron")) == [
        "nothing to do: no version is running and nothing needed repair"]
    assert monitor_mod.watch_lines([], [PIPELINE]) == [
        f"watch: no promoted version is under watch ({PIPELINE}: auto_rollback off, or no grace period running)"]


def test_monitor_keeps_a_standby_within_its_grace_period(k, fake_log):
    v1, v2 = _serving_pair(k, fake_log)
    assert monitor(k, actor="cron").stopped == []
    assert k.registry.get_version(PIPELINE, v1).state == "standby"


GRACE = 300.0
ROWS = [("m1", "swe", "SWE", "Ada", 1), ("m2", "pm", "PM", "Grace", 2)]


@pytest.mark.parametrize("since_from", ["standby_since", "alias_history"])
@pytest.mark.parametrize("after, stopped", [(GRACE - 0.5, False), (GRACE, True), (GRACE + 0.5, True)])
def test_the_standby_grace_period_boundary_in_seconds(k, fake_log, fake_jobs, monkeypatch, after, stopped,
                                                      since_from):
    """The promote path writes when the standby began; monitor reads it: both in seconds."""
    kk = Kappa(k.settings, registry=k.registry, pipelines={PIPELINE: make_spec(grace_period_seconds=GRACE)})
    clock = Clock().install(monkeypatch, serving)
    v1, v2 = allocate(kk).version, allocate(kk).version
    pid = start_version(kk.version(PIPELINE, v1), actor="t").pid
    wait_for(lambda: inspect_version(kk.version(PIPELINE, v1)).health == "running", 15, "the fake job of v1 to run")
    fake_running(kk, v2)
    fake_log.read_all()
    for v in (v1, v2):
        kk.registry.set_state(PIPELINE, v, "caught_up")
    kk.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v1, actor="t", reason="r")
    set_serving_states(kk, kk.pipeline(PIPELINE), v1, None)
    kk.registry.flip_alias(ALIAS, PIPELINE, expected_version=v1, new_version=v2, actor="t", reason="r")
    set_serving_states(kk, kk.pipeline(PIPELINE), v2, v1)      # v1 is standby from clock.now on
    publish_current(kk, ALIAS)
    rec = kk.registry.get_version(PIPELINE, v1)
    assert (rec.state, rec.details["standby_since"], rec.details["standby_until"]) == ("standby", clock.now,
                                                                                       clock.now + GRACE)
    began = clock.now
    if since_from == "alias_history":              # versions from before standby_since was recorded
        kk.registry.set_state(PIPELINE, v1, "standby", details={})
        began = kk.registry.alias_history(ALIAS)[-1].at
    Clock(began + after).install(monkeypatch, monitor_mod)
    report = monitor(kk, actor="cron")
    assert report.errors == [] and report.problems == []
    if stopped:
        assert [(s["version"], s["how"], s["pid"]) for s in report.stopped] == [(v1, "graceful", pid)]
        assert kk.registry.get_version(PIPELINE, v1).state == "stopped"
        (stop,) = kk.registry.audit_log(PIPELINE, action="stop")
        assert stop.reason == "standby grace period of 300 s is over"
    else:
        assert report.stopped == []
        assert kk.registry.get_version(PIPELINE, v1).state == "standby"
        assert inspect_version(kk.version(PIPELINE, v1)).health == "running"
        assert kk.registry.audit_log(PIPELINE, action="stop") == []


@pytest.mark.parametrize("grace_seconds, grace", [(5, 5.0), (None, GRACE)])
@pytest.mark.parametrize("before", [True, False])
def test_the_promotes_own_grace_period_is_the_one_the_monitor_keeps(k, fake_log, fake_jobs, monkeypatch,
                                                                     grace_seconds, grace, before):
    """`promote(grace_seconds=...)` (kappa_promote's form, `kappa promote --grace`) is stored with the flip,
    so the monitor stops the standby after that grace, not the pipeline's; None keeps the pipeline's."""
    kk = Kappa(k.settings, registry=k.registry, pipelines={PIPELINE: make_spec(grace_period_seconds=GRACE)})
    v1 = allocate(kk).version
    pid = start_version(kk.version(PIPELINE, v1), actor="t").pid
    wait_for(lambda: inspect_version(kk.version(PIPELINE, v1)).health == "running", 15, "the fake job of v1 to run")
    write_table(kk.paths(PIPELINE, v1).table, profiles(ROWS))
    kk.registry.set_state(PIPELINE, v1, "caught_up")
    kk.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v1, actor="t", reason="r", serve=True)
    v2 = ready_version(kk, fake_log, ROWS)
    res = promote(kk.version(PIPELINE, v2), actor="ana", reason="new rules", grace_seconds=grace_seconds)
    assert res.message.endswith(f"; v{v1} is standby for {grace:.0f} s")
    details = kk.registry.get_version(PIPELINE, v1).details
    since = details["standby_since"]
    assert details["standby_until"] == since + grace
    assert monitor_mod.standby_until(kk.version(PIPELINE, v1)) == since + grace
    assert monitor_mod.standby_until(kk.version(PIPELINE, v2)) is None          # it serves
    Clock(since + grace - (1 if before else 0)).install(monkeypatch, monitor_mod)
    report = monitor(kk, actor="cron")
    assert report.errors == [] and report.problems == []
    if before:
        assert report.stopped == [] and kk.registry.get_version(PIPELINE, v1).state == "standby"
        assert kk.registry.audit_log(PIPELINE, action="stop") == []
    else:
        assert [(s["version"], s["pid"]) for s in report.stopped] == [(v1, pid)]
        (stop,) = kk.registry.audit_log(PIPELINE, action="stop")
        assert stop.reason == f"standby grace period of {grace:.0f} s is over"
        assert monitor_mod.standby_until(kk.version(PIPELINE, v1)) is None      # stopped: no longer a standby


@pytest.mark.parametrize("lag, alert", [(500, False), (501, True)])
def test_sustained_serving_lag_boundary_is_the_threshold_itself(k, fake_log, lag, alert):
    v1, v2 = _serving_pair(k, fake_log)
    fake_log.ends = {tp: e + (lag - 250 if tp[1] == 0 else 250) for tp, e in fake_log.ends.items()}
    reports = [monitor(k, actor="cron", lag_threshold=500, raise_on_problem=False) for _ in range(3)]
    assert [v["lag"] for r in reports for v in r.versions if v["version"] == v2] == [lag] * 3
    assert [r.problems for r in reports[:2]] == [[], []]   # two samples of the three: not sustained yet
    assert reports[2].problems == ([f"{PIPELINE} v{v2} serves alias '{ALIAS}' and lags beyond its limits (lag <= 500 "
                                    f"records and <= 60 s behind): last 3 samples {lag}, {lag}, {lag} records"]
                                   if alert else [])


def test_monitor_raises_when_the_serving_job_fails(k, fake_log):
    v1, v2 = _serving_pair(k, fake_log)
    fake_running(k, v2, state="failed", error="SinkError: disk full")
    with pytest.raises(LifecycleError) as e:
        monitor(k, actor="cron")
    # a SinkError is deterministic: the supervisor gives the job up at once instead of restarting it
    assert str(e.value) == (f"{PIPELINE} v{v2}: its job reported a SinkError, which a restart would repeat; not "
                            f"restarting it; last error: the job reported failure: SinkError: disk full. Fix the "
                            f"cause, then start it again (`kappa rollback {PIPELINE} {v2}` for a version that "
                            f"served, or deploy)")
    rec = k.registry.get_version(PIPELINE, v2)
    assert rec.state == "serving" and "disk full" in rec.error   # still serving: the alias points at it
    assert k.registry.audit_log(None, action="monitor")[-1].outcome == "alert"


def test_monitor_raises_on_sustained_serving_lag_only(k, fake_log):
    v1, v2 = _serving_pair(k, fake_log)
    fake_log.ends = {tp: e + 500 for tp, e in fake_log.ends.items()}
    monitor(k, actor="cron")          # one or two lagging samples: not yet an alert
    monitor(k, actor="cron")
    with pytest.raises(NotReadyError, match=rf"{PIPELINE} v{v2} serves alias '{ALIAS}' and lags beyond its limits "
                                            r"\(lag <= 0 records and <= 60 s behind\): last 3 samples 1,000, 1,000, "
                                            r"1,000 records"):
        monitor(k, actor="cron")
    assert monitor(k, actor="cron", lag_threshold=2000).problems == []
