"""Lag in seconds: measured, stored with the samples, and a limit of the catch-up rule (`catchup_seconds`)."""

from __future__ import annotations

import io
import time

import pytest
from control_helpers import PIPELINE, TOPIC, allocate, fake_running, make_spec, samples_a_batch_apart
from rich.console import Console

from orchestrator.core.exceptions import ConfigError
from orchestrator.core.pipelines import load_pipelines
from orchestrator.lifecycle.await_ready import readiness
from orchestrator.observe import lag as lag_mod
from orchestrator.observe.lag import measure_lag, sample_lag
from orchestrator.observe.progress import LagProgress


@pytest.fixture
def ages(monkeypatch):
    """The age of the oldest unprocessed record, as the broker would tell it (one value per call)."""
    answers: list[float | None] = []
    seen: list[dict] = []

    def oldest_unread_age(k, details, *, now, timeout):
        seen.append({(d.topic, d.partition): d.next_offset for d in details if d.lag > 0})
        return answers.pop(0) if len(answers) > 1 else answers[0]

    monkeypatch.setattr(lag_mod, "oldest_unread_age", oldest_unread_age)
    return answers, seen


@pytest.fixture
def spec(request):
    """The pipeline, with the catch-up settings a test names through `indirect` parametrization."""
    return make_spec(**getattr(request, "param", {}))


SECONDS = pytest.mark.parametrize("spec", [{"catchup_seconds": 30.0, "catchup_threshold": 100}], indirect=True)


def _running(k, fake_log):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)
    fake_log.read_all(1)  # partition 0 still 100 records behind
    return v


def test_lag_seconds_is_measured_at_the_next_offsets_and_stored(k, fake_log, ages):
    answers, seen = ages
    answers.append(42.5)
    v = _running(k, fake_log)
    r = sample_lag(k.version(PIPELINE, v))
    assert (r.total, r.lag_seconds) == (100, 42.5)
    assert seen == [{(TOPIC, 0): 0}]                  # only the lagging partition, at its next offset
    (s,) = k.registry.lag_samples(PIPELINE, v)
    assert (s.total, s.lag_seconds) == (100, 42.5)
    fake_log.read_all()
    assert measure_lag(k.version(PIPELINE, v)).lag_seconds == 0.0   # caught up: 0 without asking the broker
    assert len(seen) == 1


def test_without_a_broker_lag_seconds_is_unknown_not_an_error(k, fake_log, monkeypatch):
    from orchestrator.observe import lagtime

    monkeypatch.setattr(lag_mod, "oldest_unread_age", lagtime.oldest_unread_age)
    v = _running(k, fake_log)   # nothing listens at 127.0.0.1:9: the fetch gives up at once
    started = time.monotonic()
    r = measure_lag(k.version(PIPELINE, v))
    assert (r.total, r.lag_seconds) == (100, None)
    assert time.monotonic() - started < lag_mod.LAG_SECONDS_TIMEOUT


def test_the_default_catchup_seconds_is_a_minute_and_records_alone_do_not_make_ready(k, fake_log, ages):
    ages[0].extend([90.0])                              # 100 records (under a threshold of 100) but 90 s old
    v = allocate(k, threshold=100).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)
    fake_log.read_all(1)
    rs = samples_a_batch_apart(k, v, 4)
    assert k.pipeline(PIPELINE).catchup_seconds == 60.0
    assert [(r.state, r.consecutive_ok) for r in rs] == [("hydrating", 0)] * 4
    assert rs[-1].reason == "90 s behind > catchup_seconds 60"


@SECONDS
def test_ready_needs_the_oldest_record_within_catchup_seconds(k, fake_log, ages):
    ages[0].extend([45.0, 20.0])                        # 45 s behind, then 20 s from then on
    v = _running(k, fake_log)
    r = readiness(k.version(PIPELINE, v))
    assert (r.state, r.consecutive_ok) == ("hydrating", 0)
    assert r.reason == "45 s behind > catchup_seconds 30"
    rs = samples_a_batch_apart(k, v, 3)
    r = rs[-1]
    assert (r.state, r.total_lag, r.lag_seconds) == ("ready", 100, 20.0)
    assert [s["lag_seconds"] for s in r.samples] == [20.0] * 3
    (entry,) = [e for e in k.registry.audit_log(PIPELINE) if e.action == "caught_up"]
    assert (entry.details["rule"], entry.details["catchup_seconds"], entry.details["threshold"]) == (r.rule, 30.0, 100)
    assert r.rule.startswith("lag <= 100 records and <= 30 s behind in 3 samples a micro-batch apart")
    assert "3/3 samples with lag <= 100 records and <= 30 s behind" in r.summary()


@SECONDS
def test_an_unknown_age_never_counts(k, fake_log, ages):
    ages[0].append(None)
    v = _running(k, fake_log)
    rs = samples_a_batch_apart(k, v, 4)
    assert [(r.state, r.consecutive_ok) for r in rs] == [("hydrating", 0)] * 4
    assert rs[-1].reason.startswith("lag in seconds unknown")


@SECONDS
def test_records_over_the_threshold_do_not_count_however_fresh(k, fake_log, ages):
    ages[0].append(5.0)
    v = _running(k, fake_log)
    fake_log.ends[(TOPIC, 0)] += 1                       # 101 records behind, 5 s old
    r = readiness(k.version(PIPELINE, v))
    assert (r.state, r.reason) == ("hydrating", "lag 101 > threshold 100 records")
    fake_log.read_all()
    r = samples_a_batch_apart(k, v, 3)[-1]
    assert (r.state, r.lag_seconds) == ("ready", 0.0)


def test_the_old_settings_are_refused_naming_what_replaces_them(tmp_path):
    base = ('[pipelines.p]\njob = "standardize"\ntopics = ["t"]\nkey = "id"\nalias = "p_live"\n')
    f = tmp_path / "pipelines.toml"
    f.write_text(base + 'catchup_seconds = 30\n')
    assert load_pipelines(f)["p"].catchup_seconds == 30.0
    f.write_text(base + 'catchup_max_lag_seconds = 30\n')
    with pytest.raises(ConfigError, match=r"pipeline 'p', field 'catchup_max_lag_seconds': renamed catchup_seconds: "
                                          r"rename it"):
        load_pipelines(f)
    f.write_text(base + 'catchup_rule = "seconds"\n')
    with pytest.raises(ConfigError, match=r"field 'catchup_rule': removed: a version is caught up when within both "
                                          r"catchup_threshold and catchup_seconds; delete the line"):
        load_pipelines(f)
    for bad in ("0", "-1", '"60"'):
        f.write_text(base + f'catchup_seconds = {bad}\n')
        with pytest.raises(ConfigError, match=r"field 'catchup_seconds': Input should be (greater than 0|a valid number)"):
            load_pipelines(f)


def test_progress_lines_show_the_age_and_both_limits():
    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=False, highlight=False)
    with LagProgress(console) as bars:
        bars.update({"pipeline": "p", "version": 2, "state": "hydrating", "total_lag": 500, "eta_seconds": None,
                     "consecutive_ok": 0, "required_samples": 3, "threshold": 100, "lag_seconds": 150.0,
                     "catchup_seconds": 30.0})
        bars.update({"pipeline": "p", "version": 2, "state": "hydrating", "total_lag": 400, "eta_seconds": None,
                     "consecutive_ok": 0, "required_samples": 3, "threshold": 100, "lag_seconds": None,
                     "catchup_seconds": 30.0})
    first, second = buf.getvalue().splitlines()
    assert first.endswith("hydrating (0/3 samples <= 100, <= 30 s old), 2.5 min behind")
    assert second.endswith(", unknown behind")


@SECONDS
def test_airflow_lag_line_shows_seconds_and_both_limits(k, fake_log, ages):
    from orchestrator.airflow.tasks import _lag_line

    ages[0].append(12.0)
    v = _running(k, fake_log)
    line = _lag_line(readiness(k.version(PIPELINE, v)))
    assert f"{PIPELINE} v{v}: hydrating; lag 100 records, 12 s behind (lag <= 100 records and <= 30 s behind); " \
           f"ETA 0 s; 1/3 samples counted; 4 micro-batches since the job started; job running" in line


def test_a_floor_is_shown_as_a_floor_with_no_eta_on_every_screen():
    """Issue 30, item 4: while a first batch has not committed, '1,001' with 'ETA 0 s' read as the lag."""
    from orchestrator.airflow.tasks import _lag_line
    from orchestrator.cli.render import status_table
    from orchestrator.lifecycle.await_ready import Readiness

    r = Readiness(pipeline="p", version=2, state="hydrating", total_lag=1001, partitions={"t:0": 150, "t:1": 44},
                  eta_seconds=None, consecutive_ok=0, required_samples=3, threshold=1000, job_health="running",
                  reason="its first micro-batch has not committed yet", at=0.0, lag_seconds=61.0, floored=True,
                  unread=194)
    floor = "≥ 1,001 (first batch not yet committed; 194 left to read)"
    assert r.lag_text() == floor and f"lag {floor}, " in r.summary()
    assert f"p v2: hydrating; lag {floor}, 61 s behind (lag <= 1,000 records and <= 60 s behind); ETA unknown;" \
        in _lag_line(r)
    buf = io.StringIO()
    Console(file=buf, width=300).print(status_table([{"pipeline": "p", "versions": [
        {"version": 2, "serving": False, "state": "backfilling", "readiness": "hydrating", "lag": 1001,
         "lag_floored": True, "unread": 194, "eta_seconds": None, "rejects": 0, "rules_version": None,
         "job": {"health": "running"}}]}]))
    assert floor in buf.getvalue()
    bars = io.StringIO()
    with LagProgress(Console(file=bars, width=300, force_terminal=False)) as progress:
        progress.update(r.model_dump())
    assert floor in bars.getvalue() and "ETA -" in bars.getvalue()
