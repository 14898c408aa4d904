"""The watch of a promoted version (fake jobs, fake log): a degraded version is rolled back by
itself once, audited with its cause; a healthy one passes; a manual rollback ends the watch; a
version rolled back automatically is promoted again only with --force; a pass killed between the
decision and the flip is finished by the next pass."""

from __future__ import annotations

import pytest

from control_helpers import ALIAS, PIPELINE, make_spec, ready_version, write_table, profiles
from orchestrator import jobctl
from orchestrator.core import crashpoints
from orchestrator.core.checks import CheckSpec
from orchestrator.core.exceptions import LifecycleError, NotReadyError
from orchestrator.lifecycle.monitor import monitor
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.rollback import rollback
from orchestrator.lifecycle.watch import describe_watch, watch_pass
from orchestrator.observe.metrics import collect, parse_text, render_text
from orchestrator.serving import resolve_alias

ROWS = [("m1", "swe", "SWE", "Ada", 1), ("m2", "pm", "PM", "Grace", 2)]
BLANK = CheckSpec(name="blank_titles", max=0, watch=True,
                  sql="SELECT count(*) FROM candidate WHERE title IS NULL OR title = ''")


@pytest.fixture
def spec():
    return make_spec(auto_rollback=True, checks=(BLANK,), grace_period_seconds=600.0)


@pytest.fixture
def stops(monkeypatch):
    """stop_version recorded, not run: the fake jobs' PID is this test process."""
    calls = []
    monkeypatch.setattr(jobctl, "stop_version", lambda v, **kw: calls.append((v.pipeline, v.version, kw.get("reason"))))
    return calls


def promoted_twice(k, fake_log):
    v1 = ready_version(k, fake_log, ROWS)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS)
    res = promote(k.version(PIPELINE, v2), actor="bob", reason="new rules")
    assert res.message.endswith(f"v{v1} is standby for 600 s, while v{v2} is watched (auto_rollback)")
    return v1, v2


def watch(k, v):
    return k.registry.get_version(PIPELINE, v).details["watch"]


def test_a_watched_check_failing_on_the_live_table_rolls_back_once_with_its_cause(k, fake_log, stops):
    v1, v2 = promoted_twice(k, fake_log)
    assert watch(k, v2)["state"] == "watching" and watch(k, v2)["standby"] == v1
    assert [a["kind"] for a in watch_pass(k, k.pipeline(PIPELINE))] == ["sampled"]
    assert watch(k, v2)["samples"] == 1
    write_table(k.paths(PIPELINE, v2).table, profiles(ROWS + [("m3", "cto", "", "Ken", 3)]))
    with pytest.raises(LifecycleError) as e:
        monitor(k, actor="supervisor")
    cause = f"v{v2}: check 'blank_titles' failed on the live table: 1 outside its limit (max 0)"
    assert str(e.value) == f"{PIPELINE} v{v2} was rolled back automatically to v{v1}: {cause}"
    assert resolve_alias(ALIAS, k.settings)["version"] == v1
    w = watch(k, v2)
    assert (w["state"], w["settled"], w["cause"], w["samples"]) == ("rolled_back", True, cause, 2)
    assert stops == [(PIPELINE, v2, f"degraded after its promote, kept for inspection (stopped): {cause}")]
    rb = [e for e in k.registry.audit_log(PIPELINE, action="rollback") if e.outcome == "ok"]
    assert [(e.actor, e.reason) for e in rb] == [("kappa-watch", f"automatic rollback: {cause}")]
    outcomes = [e.outcome for e in k.registry.audit_log(PIPELINE, action="watch")]
    assert outcomes == ["rolling_back", "rolled_back"]
    # what the operator sees: kappa status's line, the metrics endpoint's figures
    assert describe_watch(v2, w) == f"watch of v{v2} (standby v{v1}): rolled_back, 2 samples; rolled back " \
                                    f"automatically: {cause}"
    figures = parse_text(render_text(collect(k)))
    labels = (("pipeline", PIPELINE), ("version", str(v2)))
    assert figures[("kappa_watch_state", tuple(sorted(labels + (("state", "rolled_back"),))))] == 1
    assert figures[("kappa_watch_state", tuple(sorted(labels + (("state", "watching"),))))] == 0
    assert figures[("kappa_watch_samples", labels)] == 2
    assert figures[("kappa_watch_decisions_total", (("outcome", "rolled_back"), ("pipeline", PIPELINE)))] == 1
    # once per promote: later passes do nothing more
    assert watch_pass(k, k.pipeline(PIPELINE)) == []
    assert len([e for e in k.registry.audit_log(PIPELINE, action="rollback") if e.outcome == "ok"]) == 1


def test_supervision_giving_up_on_the_promoted_job_rolls_back(k, fake_log, stops):
    v1, v2 = promoted_twice(k, fake_log)
    k.registry.audit("restart", actor="supervisor", pipeline=PIPELINE, version=v2, outcome="gave_up",
                     details={"error": "its job died 1 time(s) within 600 s (max_restarts 0)"})
    (a,) = watch_pass(k, k.pipeline(PIPELINE))
    assert (a["kind"], a["to_version"]) == ("rolled_back", v1)
    assert a["cause"] == (f"v{v2}: its job was given up by supervision (its job died 1 time(s) within 600 s "
                          f"(max_restarts 0))")
    assert resolve_alias(ALIAS, k.settings)["version"] == v1


def test_a_version_rolled_back_automatically_is_promoted_again_only_with_force(k, fake_log, stops):
    v1, v2 = promoted_twice(k, fake_log)
    write_table(k.paths(PIPELINE, v2).table, profiles(ROWS + [("m3", "cto", None, "Ken", 3)]))
    watch_pass(k, k.pipeline(PIPELINE))
    write_table(k.paths(PIPELINE, v2).table, profiles(ROWS))
    with pytest.raises(NotReadyError, match=rf"auto_rollback: v{v2} was rolled back automatically after its "
                                            rf"promote \(v{v2}: check 'blank_titles' failed"):
        promote(k.version(PIPELINE, v2), actor="bob", reason="again")
    res = promote(k.version(PIPELINE, v2), actor="bob", reason="fixed the blank titles upstream", force=True)
    assert res.flipped and res.forced == ["auto_rollback"]
    assert watch(k, v2)["state"] == "watching"  # a new promote, a new watch


def test_a_healthy_version_passes_its_grace_period_and_a_manual_rollback_ends_a_watch(k, fake_log, stops):
    v1, v2 = promoted_twice(k, fake_log)
    rollback(k, k.pipeline(PIPELINE), actor="carol", reason="changed my mind")
    w = watch(k, v2)
    assert (w["state"], w["ended_by"]) == ("ended", "a rollback of the alias during the watch")
    assert watch_pass(k, k.pipeline(PIPELINE)) == []
    # promoted again by hand, then its grace period runs out with nothing wrong
    res = promote(k.version(PIPELINE, v2), actor="carol", reason="after all")
    assert res.flipped and watch(k, v2)["state"] == "watching"
    k.registry.update_watch(PIPELINE, v2, expected_state="watching", expected_samples=0,
                            watch={**watch(k, v2), "until": 0.0})
    assert [a["kind"] for a in watch_pass(k, k.pipeline(PIPELINE))] == ["passed"]
    assert resolve_alias(ALIAS, k.settings)["version"] == v2 and stops == []


def test_a_pass_killed_between_the_decision_and_the_flip_is_finished_by_the_next(k, fake_log, stops):
    v1, v2 = promoted_twice(k, fake_log)
    write_table(k.paths(PIPELINE, v2).table, profiles(ROWS + [("m3", "cto", None, "Ken", 3)]))
    with crashpoints.armed_at("watch.decided"), pytest.raises(crashpoints.KappaCrashed):
        watch_pass(k, k.pipeline(PIPELINE))
    assert watch(k, v2)["state"] == "rolling_back"
    assert resolve_alias(ALIAS, k.settings)["version"] == v2
    (a,) = watch_pass(k, k.pipeline(PIPELINE))
    assert (a["kind"], a["to_version"]) == ("rolled_back", v1)
    assert resolve_alias(ALIAS, k.settings)["version"] == v1
    assert watch(k, v2)["state"] == "rolled_back"


def test_a_pass_killed_between_the_flip_and_the_publish_is_published_and_settled_by_the_next(k, fake_log, stops):
    v1, v2 = promoted_twice(k, fake_log)
    write_table(k.paths(PIPELINE, v2).table, profiles(ROWS + [("m3", "cto", None, "Ken", 3)]))
    with crashpoints.armed_at("rollback.flipped"), pytest.raises(crashpoints.KappaCrashed):
        watch_pass(k, k.pipeline(PIPELINE))
    assert k.registry.get_alias(ALIAS).version == v1
    assert resolve_alias(ALIAS, k.settings)["version"] == v2  # not published yet
    assert watch(k, v2)["state"] == "rolled_back" and not watch(k, v2).get("settled")
    (a,) = watch_pass(k, k.pipeline(PIPELINE))
    assert (a["kind"], a["degraded"]) == ("rolled_back", "stopped")
    assert resolve_alias(ALIAS, k.settings)["version"] == v1 and watch(k, v2)["settled"]


def test_without_auto_rollback_nothing_is_watched(k, fake_log, stops):
    k.pipelines[PIPELINE] = make_spec()
    v1 = ready_version(k, fake_log, ROWS)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS)
    res = promote(k.version(PIPELINE, v2), actor="bob", reason="new rules")
    assert "watched" not in res.message and "watch" not in (k.registry.get_version(PIPELINE, v2).details or {})
    assert watch_pass(k, k.pipeline(PIPELINE)) == []
