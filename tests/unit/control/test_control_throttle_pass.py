"""Issue 32, part 2: the controller's passes over the registry, the operator's verb, status and plot.

The state lives in the version's details (`details["throttle"]`) and every change is an audit entry,
so a supervisor that restarts (a new `Kappa` on the same registry) continues where the last one was.
"""

from __future__ import annotations


import pytest

from control_helpers import ALIAS, PIPELINE, allocate, make_spec
from orchestrator.context import Kappa
from orchestrator.core.exceptions import ConfigError, ConflictError, NotFoundError, RefusedError
from orchestrator.lifecycle.throttle import (current_throttle, set_throttle, throttle_changes, throttle_lines,
                                             throttle_pass)

T0 = 1_700_000_000.0


def _pair(k):
    """v1 serves, v2 backfills (no job of either runs here: only the registry is exercised)."""
    v1, v2 = allocate(k).version, allocate(k).version
    k.registry.set_state(PIPELINE, v1, "caught_up")
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v1, actor="t", reason="r", serve=True)
    k.registry.set_state(PIPELINE, v2, "backfilling")
    return v1, v2


def _lag(k, v, seconds, at):
    k.registry.add_lag_sample(PIPELINE, v, 10, {}, at=at, lag_seconds=seconds)


def _pass(k, now):
    return throttle_pass(k, k.pipeline(PIPELINE), actor="supervise:ops", serving=1, now=now)


def test_a_pass_backs_off_while_serving_lags_holds_within_the_interval_and_recovers(k):
    v1, v2 = _pair(k)
    _lag(k, v1, 75.0, T0)                                   # over the default bound, catchup_seconds 60
    (a,) = _pass(k, T0)
    assert (a["kind"], a["version"], a["from"], a["to"], a["mode"]) == ("throttle", v2, 1.0, 0.5, "adaptive")
    assert a["why"] == "serving lag 75.0 s > bound 60 s"
    t = k.version(PIPELINE, v2).record.details["throttle"]
    assert (t["share"], t["mode"], t["changed_at"], t["by"], t["nice"]) == (0.5, "adaptive", T0, "supervise:ops", 3)
    (e,) = k.registry.audit_log(PIPELINE, version=v2, action="throttle")
    assert (e.actor, e.reason, e.details["from"], e.details["to"]) == ("supervise:ops", a["why"], 1.0, 0.5)
    assert e.details["lag_seconds"] == 75.0 and e.details["bound_seconds"] == 60.0

    assert _pass(k, T0 + 4.9) == []                          # within backfill_interval_seconds (5 s)
    # a supervisor restarted: a new Kappa on the same registry continues from the registry's state
    k2 = Kappa(k.settings, registry=k.registry, pipelines=k.pipelines)
    assert [x["to"] for x in _pass(k2, T0 + 5.0)] == [0.25]
    _lag(k, v1, 10.0, T0 + 9)                                 # under half the bound: recover
    assert [x["to"] for x in _pass(k2, T0 + 10.0)] == [0.35]
    _lag(k, v1, None, T0 + 15)                                # unknown: hold
    assert _pass(k2, T0 + 20.0) == []
    assert [c["to"] for c in throttle_changes(k.version(PIPELINE, v2))] == [0.5, 0.25, 0.35]


def test_a_stale_serving_sample_holds_and_no_serving_version_lets_the_backfill_run_full(k):
    v1, v2 = _pair(k)
    _lag(k, v1, 75.0, T0 - 1000)
    assert _pass(k, T0) == []                                 # the newest sample is 1000 s old
    k.registry.set_state(PIPELINE, v2, "backfilling", details={"throttle": {
        "share": 0.2, "mode": "adaptive", "changed_at": T0 - 100, "by": "x", "why": "y"}})
    (a,) = throttle_pass(k, k.pipeline(PIPELINE), actor="s", serving=None, now=T0)
    assert (a["from"], a["to"]) == (0.2, 0.3)


def test_a_fixed_share_is_left_alone_by_the_controller_and_a_promoted_version_gets_its_full_share_back(k):
    v1, v2 = _pair(k)
    set_throttle(k.version(PIPELINE, v2), actor="ops", share=0.3, reason="nightly batch window")
    _lag(k, v1, 300.0, T0)
    assert _pass(k, T0) == []
    assert current_throttle(k.version(PIPELINE, v2))["share"] == 0.3
    k.registry.set_state(PIPELINE, v2, "caught_up")
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=v1, new_version=v2, actor="t", reason="r", serve=True)
    (a,) = throttle_pass(k, k.pipeline(PIPELINE), actor="s", serving=v2, now=T0 + 60)
    assert (a["version"], a["from"], a["to"], a["why"]) == (v2, 0.3, 1.0, "serving: its job runs at full share")
    assert throttle_pass(k, k.pipeline(PIPELINE), actor="s", serving=v2, now=T0 + 120) == []


def test_the_operator_verb_records_audits_and_switches_back_to_adaptive(k):
    v1, v2 = _pair(k)
    res = set_throttle(k.version(PIPELINE, v2), actor="ops", share=0.3, reason="nightly window")
    assert (res["from"], res["to"], res["mode"]) == (1.0, 0.3, "fixed")
    assert "its job is not running here" in res["message"]
    res = set_throttle(k.version(PIPELINE, v2), actor="ops", adaptive=True)
    assert (res["from"], res["to"], res["mode"]) == (0.3, 0.3, "adaptive")
    changes = throttle_changes(k.version(PIPELINE, v2))
    assert [(c["by"], c["to"], c["mode"], c["why"]) for c in changes] == [
        ("ops", 0.3, "fixed", "operator: nightly window"), ("ops", 0.3, "adaptive", "operator")]


@pytest.mark.parametrize("kw, error, words", [
    ({"share": 0.0}, ConfigError, "must be in (0, 1]"),
    ({"share": 1.5}, ConfigError, "must be in (0, 1]"),
    ({}, ConfigError, "give either a share"),
    ({"share": 0.5, "adaptive": True}, ConfigError, "not both"),
])
def test_the_operator_verb_refuses_a_bad_request_and_changes_nothing(k, kw, error, words):
    v1, v2 = _pair(k)
    with pytest.raises(error) as e:
        set_throttle(k.version(PIPELINE, v2), actor="ops", **kw)
    assert words in str(e.value) and "\n" not in str(e.value)
    assert "throttle" not in (k.version(PIPELINE, v2).record.details or {})
    assert k.registry.audit_log(PIPELINE, action="throttle") == []


def test_the_operator_verb_refuses_a_version_that_serves_or_does_not_run(k):
    v1, v2 = _pair(k)
    with pytest.raises(RefusedError, match=rf"{PIPELINE} v{v1} is serving: only a version that runs and does not "
                                           rf"serve yet \(backfilling, caught_up, starting\) has a share to change"):
        set_throttle(k.version(PIPELINE, v1), actor="ops", share=0.5)
    k.registry.set_state(PIPELINE, v2, "stopped")
    with pytest.raises(RefusedError, match="is stopped"):
        set_throttle(k.version(PIPELINE, v2), actor="ops", share=0.5)
    with pytest.raises(NotFoundError, match="has no version v9"):
        k.version(PIPELINE, 9)


def test_two_changes_from_the_same_reading_cannot_both_land(k):
    v1, v2 = _pair(k)
    k.registry.update_throttle(PIPELINE, v2, expected_changed_at=None, throttle={"share": 0.5, "changed_at": T0})
    with pytest.raises(ConflictError, match="changed meanwhile"):
        k.registry.update_throttle(PIPELINE, v2, expected_changed_at=None, throttle={"share": 0.2})
    assert k.version(PIPELINE, v2).record.details["throttle"]["share"] == 0.5


def test_the_throttle_leaves_the_other_details_alone(k):
    v1, v2 = _pair(k)
    k.registry.set_state(PIPELINE, v2, "backfilling", details={"estimate": {"seconds": 12}})
    set_throttle(k.version(PIPELINE, v2), actor="ops", share=0.5)
    details = k.version(PIPELINE, v2).record.details
    assert details["estimate"] == {"seconds": 12} and details["throttle"]["share"] == 0.5


def test_status_lines_show_the_share_in_force_and_the_last_changes(k):
    v1, v2 = _pair(k)
    set_throttle(k.version(PIPELINE, v2), actor="ops", share=0.25, reason="window", now=T0)
    v = k.version(PIPELINE, v2)
    lines = throttle_lines(v2, current_throttle(v), throttle_changes(v))
    assert lines[0] == f"v{v2} share 0.25 (nice 6), fixed, since 22:13:20 UTC by ops: operator: window"
    assert lines[1].endswith(" 1 -> 0.25 (fixed, ops): operator: window")
    fresh = throttle_lines(v1, current_throttle(k.version(PIPELINE, v1)), [])
    assert fresh == [f"v{v1} share 1 (nice 0), adaptive: the pipeline's backfill_share"]


def test_the_lag_plot_marks_each_change_of_share_on_the_version_curve(k, monkeypatch, tmp_path):
    from orchestrator.observe import lagplot

    v1, v2 = _pair(k)
    for i in range(5):
        k.registry.add_lag_sample(PIPELINE, v2, 1000 - 100 * i, {}, at=T0 + 10 * i, lag_seconds=50.0)
    set_throttle(k.version(PIPELINE, v2), actor="ops", share=0.25)
    seen = {}
    monkeypatch.setattr(lagplot, "plot_lag", lambda series, out, title: seen.setdefault("series", series))
    lagplot.plot_pipeline_lag(k.versions(PIPELINE), tmp_path / "p.png")
    by_label = {s.label: s for s in seen["series"]}
    assert [share for _, share in by_label[f"{PIPELINE} v{v2}"].shares] == [0.25]
    assert by_label[f"{PIPELINE} v{v1}"].shares == []
    monkeypatch.undo()
    s = lagplot.series_from_samples("x", k.registry.lag_samples(PIPELINE, v2))
    from dataclasses import replace
    out = lagplot.plot_lag([replace(s, shares=[(T0 + 15, 0.25)])], tmp_path / "q.png")
    assert lagplot.is_png(out)


def test_pipeline_settings_of_the_backfill_are_validated_with_one_line(tmp_path):
    from orchestrator.core.pipelines import load_pipelines

    spec = make_spec()
    assert (spec.backfill_share, spec.backfill_adaptive, spec.backfill_lag_bound, spec.backfill_interval_seconds) == \
        (1.0, True, 60.0, 5.0)
    assert make_spec(watch_max_lag_seconds=20.0).backfill_lag_bound == 20.0
    assert make_spec(backfill_lag_bound_seconds=5.0, watch_max_lag_seconds=20.0).backfill_lag_bound == 5.0
    f = tmp_path / "p.toml"
    base = '[pipelines.p]\njob = "standardize"\ntopics = ["t"]\nkey = "k"\nalias = "a"\n'
    for line, words in (("backfill_share = 0", "field 'backfill_share': the backfill's share must be in (0, 1]"),
                        ("backfill_share = 2.0", "field 'backfill_share': the backfill's share must be in (0, 1]"),
                        ("backfill_interval_seconds = 0", "field 'backfill_interval_seconds'"),
                        ("backfill_adaptive = \"yes\"", "field 'backfill_adaptive'")):
        f.write_text(base + line + "\n")
        with pytest.raises(ConfigError) as e:
            load_pipelines(f)
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    f.write_text(base + "backfill_share = 1\nbackfill_adaptive = false\n")
    assert load_pipelines(f)["p"].backfill_share == 1.0


def test_a_monitor_pass_runs_the_controller_after_sampling_and_says_so_in_a_line(k, fake_log):
    from control_helpers import TOPIC, fake_running
    from orchestrator.lifecycle.monitor import monitor, report_lines

    v1, v2 = _pair(k)
    k.registry.set_state(PIPELINE, v1, "serving")
    for v in (v1, v2):
        fake_running(k, v)                       # "jobs" whose PID is this test: never reniced (apply refuses)
    fake_log.checkpoint = {(TOPIC, 0): 50, (TOPIC, 1): 50}
    fake_log.age = 120.0                         # the serving version is two minutes behind
    report = monitor(k, actor="cron", raise_on_problem=False)
    (a,) = report.throttled
    assert (a["version"], a["from"], a["to"]) == (v2, 1.0, 0.5) and a["why"] == "serving lag 120.0 s > bound 60 s"
    assert a["applied"]["processes"] == 0 and "this process" in a["applied"]["errors"][0]
    assert f"{PIPELINE} v{v2}: backfill share 1.0 -> 0.5 (adaptive): serving lag 120.0 s > bound 60 s" \
        in report_lines(report)
