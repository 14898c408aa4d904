"""Lag in seconds: measured, stored with the samples, and a catch-up rule of its own."""

from __future__ import annotations

import io
import time

import pytest
from control_helpers import PIPELINE, TOPIC, allocate, fake_running, make_spec
from rich.console import Console

from orchestrator.core.exceptions import ConfigError
from orchestrator.core.pipelines import load_pipelines
from orchestrator.lifecycle.await_ready import readiness, wait_ready
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


SECONDS = pytest.mark.parametrize("spec", [{"catchup_max_lag_seconds": 30.0, "catchup_rule": "seconds"}],
                                  indirect=True)
BOTH = pytest.mark.parametrize("spec", [{"catchup_max_lag_seconds": 30.0}], indirect=True)


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
    r = sample_lag(k, PIPELINE, v)
    assert (r.total, r.lag_seconds) == (100, 42.5)
    assert seen == [{(TOPIC, 0): 0}]                  # only the lagging partition, at its next offset
    (s,) = k.registry.lag_samples(PIPELINE, v)
    assert (s.total, s.lag_seconds) == (100, 42.5)
    fake_log.read_all()
    assert measure_lag(k, PIPELINE, v).lag_seconds == 0.0   # caught up: 0 without asking the broker
    assert len(seen) == 1


def test_without_a_broker_lag_seconds_is_unknown_not_an_error(k, fake_log):
    v = _running(k, fake_log)   # nothing listens at 127.0.0.1:9: the fetch gives up at once
    started = time.monotonic()
    r = measure_lag(k, PIPELINE, v)
    assert (r.total, r.lag_seconds) == (100, None)
    assert time.monotonic() - started < lag_mod.LAG_SECONDS_TIMEOUT


def test_records_rule_by_default_ignores_seconds(k, fake_log, ages):
    ages[0].append(1.0)
    v = _running(k, fake_log)
    r = readiness(k, PIPELINE, v)
    assert (r.rule, r.state, r.lag_seconds, r.reason) == ("records", "hydrating", 1.0, "lag 100 > threshold 0")


@SECONDS
def test_seconds_rule_readies_a_version_whose_oldest_record_is_fresh(k, fake_log, ages):
    ages[0].extend([45.0, 20.0])                        # 45 s behind, then 20 s from then on
    v = _running(k, fake_log)
    r = readiness(k, PIPELINE, v)
    assert (r.state, r.consecutive_ok) == ("hydrating", 0)
    assert r.reason == "lag 45 s > catchup_max_lag_seconds 30"
    r = wait_ready(k, PIPELINE, v, deadline_seconds=30, poll_seconds=0.01)
    assert (r.state, r.rule, r.total_lag, r.lag_seconds) == ("ready", "seconds", 100, 20.0)
    assert r.reason == "oldest unprocessed record <= 30 s old for 3 consecutive samples, job running"
    assert [s["lag_seconds"] for s in r.samples] == [20.0] * 3
    (entry,) = [e for e in k.registry.audit_log(PIPELINE) if e.action == "caught_up"]
    assert (entry.details["rule"], entry.details["max_lag_seconds"], entry.details["threshold"]) == ("seconds", 30.0, 0)
    assert "(rule 'seconds')" in r.summary()


@SECONDS
def test_seconds_rule_never_counts_an_unknown_age(k, fake_log, ages):
    ages[0].append(None)
    v = _running(k, fake_log)
    for _ in range(4):
        r = readiness(k, PIPELINE, v)
    assert (r.state, r.consecutive_ok) == ("hydrating", 0)
    assert r.reason.startswith("lag in seconds unknown")


@BOTH
def test_both_rule_needs_records_and_seconds(k, fake_log, ages):                # the rule defaults to both
    ages[0].append(5.0)
    v = _running(k, fake_log)
    r = readiness(k, PIPELINE, v)
    assert (r.rule, r.state, r.reason) == ("both", "hydrating", "lag 100 > threshold 0")
    fake_log.read_all()
    r = wait_ready(k, PIPELINE, v, deadline_seconds=30, poll_seconds=0.01)
    assert (r.state, r.lag_seconds) == ("ready", 0.0)
    assert r.reason == "lag <= 0 and oldest unprocessed record <= 30 s old for 3 consecutive samples, job running"
    (entry,) = [e for e in k.registry.audit_log(PIPELINE) if e.action == "caught_up"]
    assert entry.details["rule"] == "both"


def test_the_rule_is_validated_in_the_pipelines_file(tmp_path):
    base = ('[pipelines.p]\njob = "standardize"\ntopics = ["t"]\nkey = "id"\nalias = "p_live"\n')
    f = tmp_path / "pipelines.toml"
    f.write_text(base + 'catchup_max_lag_seconds = 30\n')
    spec = load_pipelines(f)["p"]
    assert (spec.catchup_max_lag_seconds, spec.catchup_rule_used) == (30.0, "both")
    f.write_text(base + 'catchup_rule = "seconds"\n')
    with pytest.raises(ConfigError, match=r"pipeline 'p', field 'catchup_rule': \"seconds\" needs "
                                          r"catchup_max_lag_seconds; set it"):
        load_pipelines(f)
    f.write_text(base + 'catchup_max_lag_seconds = -1\n')
    with pytest.raises(ConfigError, match=r"field 'catchup_max_lag_seconds': Input should be greater than or equal"):
        load_pipelines(f)


def test_progress_lines_show_the_age_and_the_rule():
    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=False, highlight=False)
    with LagProgress(console) as bars:
        bars.update({"pipeline": "p", "version": 2, "state": "hydrating", "total_lag": 500, "eta_seconds": None,
                     "consecutive_ok": 0, "required_samples": 3, "threshold": 100, "lag_seconds": 150.0,
                     "rule": "both", "max_lag_seconds": 30.0})
        bars.update({"pipeline": "p", "version": 2, "state": "hydrating", "total_lag": 400, "eta_seconds": None,
                     "consecutive_ok": 0, "required_samples": 3, "threshold": 100, "lag_seconds": None,
                     "rule": "both", "max_lag_seconds": 30.0})
    first, second = buf.getvalue().splitlines()
    assert first.endswith("hydrating (0/3 samples <= 100, <= 30 s old), 2.5 min behind")
    assert second.endswith(", unknown behind")


@SECONDS
def test_airflow_lag_line_shows_seconds_and_rule(k, fake_log, ages):
    from orchestrator.airflow.tasks import _lag_line

    ages[0].append(12.0)
    v = _running(k, fake_log)
    line = _lag_line(readiness(k, PIPELINE, v))
    assert f"{PIPELINE} v{v}: hydrating; lag 100 records, 12 s behind (rule seconds: oldest unprocessed " \
           f"record <= 30 s old); ETA" in line
