"""Readiness counts only recent samples: one fresh sample and two from an hour ago are one, not three."""

from __future__ import annotations

import time

from control_helpers import PIPELINE, Clock, allocate, fake_running
from orchestrator.lifecycle.await_ready import readiness
from orchestrator.observe import lag as lag_mod


def _caught_up_version(k, fake_log):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)      # the job started with this test process, before the samples below
    fake_log.read_all()
    return v


def test_samples_from_an_hour_ago_do_not_make_a_run(k, fake_log, monkeypatch):
    v = _caught_up_version(k, fake_log)
    t0 = time.time()
    k.registry.add_lag_sample(PIPELINE, v, 0, {}, at=t0, lag_seconds=0.0, batches=1)       # two samples at lag 0 ...
    k.registry.add_lag_sample(PIPELINE, v, 0, {}, at=t0 + 1, lag_seconds=0.0, batches=2)
    clock = Clock(now=t0 + 3600).install(monkeypatch, lag_mod)      # ... an hour before this one
    r = readiness(k.version(PIPELINE, v))
    assert (r.state, r.consecutive_ok, r.reason) == (
        "hydrating", 1, "1 of 3 samples a micro-batch apart with lag <= 0 records and <= 60 s behind")
    assert [s["at"] for s in r.samples] == [t0 + 3600]
    assert k.registry.get_version(PIPELINE, v).state == "backfilling"
    clock.sleep(2)
    assert readiness(k.version(PIPELINE, v)).consecutive_ok == 2
    clock.sleep(2)
    r = readiness(k.version(PIPELINE, v))
    assert (r.state, r.consecutive_ok) == ("ready", 3)
    assert k.registry.get_version(PIPELINE, v).state == "caught_up"


def test_the_window_is_a_setting_and_its_edge_counts(k, fake_log, monkeypatch):
    k.settings = k.settings.model_copy(update={"readiness_window_seconds": 60.0})
    v = _caught_up_version(k, fake_log)
    t0 = time.time()
    k.registry.add_lag_sample(PIPELINE, v, 0, {}, at=t0 - 0.5, lag_seconds=0.0)   # 60.5 s before the next: out
    k.registry.add_lag_sample(PIPELINE, v, 0, {}, at=t0, lag_seconds=0.0)         # exactly 60 s before: in
    k.registry.add_lag_sample(PIPELINE, v, 0, {}, at=t0 + 30, lag_seconds=0.0)
    Clock(now=t0 + 60).install(monkeypatch, lag_mod)
    r = readiness(k.version(PIPELINE, v), record=False)
    assert [s["at"] for s in r.samples] == [t0 + 60, t0 + 30, t0]
    assert (r.state, r.consecutive_ok) == ("ready", 3)
