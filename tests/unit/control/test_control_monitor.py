"""Monitor and reconcile of job states; the flip benchmark on small tables."""

from __future__ import annotations

import pytest

from control_helpers import ALIAS, PIPELINE, allocate, fake_running, make_spec, profiles, write_table
from orchestrator.core.kappa import Kappa
from orchestrator.core.exceptions import LifecycleError, NotReadyError
from orchestrator.dev.flipbench import flip_benchmark
from orchestrator.jobctl import inspect_version, start_version
from orchestrator.lifecycle.monitor import monitor
from orchestrator.lifecycle.reconcile import reconcile
from orchestrator.serving import publish_current, resolve_alias


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
    start_version(k, PIPELINE, v1, actor="t")  # a real (fake) process to stop
    k.registry.set_state(PIPELINE, v1, "standby", details={"standby_since": 0.0})
    report = monitor(k, actor="cron")
    assert [(s["version"], s["how"]) for s in report.stopped] == [(v1, "graceful")], report.errors
    assert k.registry.get_version(PIPELINE, v1).state == "stopped"
    assert inspect_version(k, PIPELINE, v1).health == "stopped"
    assert report.problems == []
    assert {v["version"] for v in report.versions} == {v1, v2}


def test_monitor_keeps_a_standby_within_its_grace_period(k, fake_log):
    v1, v2 = _serving_pair(k, fake_log)
    assert monitor(k, actor="cron").stopped == []
    assert k.registry.get_version(PIPELINE, v1).state == "standby"


def test_monitor_raises_when_the_serving_job_fails(k, fake_log):
    v1, v2 = _serving_pair(k, fake_log)
    fake_running(k, v2, state="failed", error="SinkError: disk full")
    with pytest.raises(LifecycleError) as e:
        monitor(k, actor="cron")
    assert str(e.value) == (f"{PIPELINE} v{v2} serves alias '{ALIAS}' but is failing: the job reported failure: "
                            f"SinkError: disk full")
    rec = k.registry.get_version(PIPELINE, v2)
    assert rec.state == "serving" and "disk full" in rec.error   # still serving: the alias points at it
    assert k.registry.audit_log(None, action="monitor")[-1].outcome == "alert"


def test_monitor_raises_on_sustained_serving_lag_only(k, fake_log):
    v1, v2 = _serving_pair(k, fake_log)
    fake_log.ends = {tp: e + 500 for tp, e in fake_log.ends.items()}
    monitor(k, actor="cron")          # one or two lagging samples: not yet an alert
    monitor(k, actor="cron")
    with pytest.raises(NotReadyError, match=rf"{PIPELINE} v{v2} serves alias '{ALIAS}' and lags beyond its "
                                            r"threshold 0: last 3 samples 1000, 1000, 1000"):
        monitor(k, actor="cron")
    assert monitor(k, actor="cron", lag_threshold=2000).problems == []


def test_reconcile_marks_dead_jobs(k, fake_log, fake_jobs):
    v = allocate(k).version
    fake_jobs[v] = "crash"
    start_version(k, PIPELINE, v, actor="t", check_exit_seconds=0)
    k.registry.set_state(PIPELINE, v, "backfilling")
    import time

    deadline = time.monotonic() + 10
    while inspect_version(k, PIPELINE, v).alive and time.monotonic() < deadline:
        time.sleep(0.05)
    actions = reconcile(k, actor="cron")
    assert [(a["kind"], a["version"]) for a in actions] == [("mark_failed", v)]
    assert k.registry.get_version(PIPELINE, v).state == "failed"
    assert reconcile(k, actor="cron") == []


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_flip_benchmark_keeps_readers_error_free_and_ends_where_it_started(tmp_path, k, mode):
    kk = Kappa(k.settings, registry=k.registry, pipelines={PIPELINE: make_spec()})
    v1, v2 = allocate(kk).version, allocate(kk).version
    write_table(kk.paths(PIPELINE, v1).table, profiles([("m1", "a", "A", "n", 1)]))
    write_table(kk.paths(PIPELINE, v2).table, profiles([("m1", "a", "B", "n", 1), ("m2", "b", "B", "n", 2)]))
    kk.registry.flip_alias(ALIAS, PIPELINE, expected_version=None, new_version=v1, actor="t", reason="r")
    kk.registry.flip_alias(ALIAS, PIPELINE, expected_version=v1, new_version=v2, actor="t", reason="r")
    figures = flip_benchmark(kk, PIPELINE, flips=21, readers=2, reader_mode=mode, warmup_seconds=0.2)
    assert figures["flips"] == 21 and figures["reader_errors"] == 0, figures["reader_error_samples"]
    assert figures["reads"] > 0 and figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert kk.registry.get_alias(ALIAS).version == v2
    assert resolve_alias(ALIAS, kk.settings)["version"] == v2
    assert kk.registry.audit_log(PIPELINE, action="flipbench")[-1].details["flips"] == 21
