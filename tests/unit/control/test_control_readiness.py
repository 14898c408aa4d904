"""Readiness states, the rule of N samples a micro-batch apart, unknown lag, and the bounded wait."""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

from control_helpers import PIPELINE, TOPIC, Clock, allocate, commit_batch, fake_running, samples_a_batch_apart
from orchestrator.lifecycle import await_ready
from orchestrator.observe import lag as lag_mod
from orchestrator.lifecycle.await_ready import readiness, wait_ready
from orchestrator.core.exceptions import NotReadyError


def test_hydrating_until_n_samples_a_micro_batch_apart(k, fake_log, monkeypatch):
    # Every sample at the same instant (a clock that does not tick between samples): each sample still
    # counts once, by its registry id, when a micro-batch committed before it.
    Clock(now=time.time()).install(monkeypatch, lag_mod)
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "starting")
    fake_running(k, v)
    r = readiness(k.version(PIPELINE, v))
    assert (r.state, r.total_lag, r.consecutive_ok) == ("hydrating", 150, 0)
    assert k.registry.get_version(PIPELINE, v).state == "backfilling"   # the job runs: backfilling
    fake_log.read_all()
    states = [r.state for r in samples_a_batch_apart(k, v, 3)]
    assert states == ["hydrating", "hydrating", "ready"]


def test_samples_closer_than_a_micro_batch_or_a_trigger_interval_count_once(k, fake_log, monkeypatch):
    """The '3 consecutive samples' 0.5 s apart: samples with no micro-batch between them count once, and
    with nothing to read (lag 0) they count once per trigger interval; the count never exceeds the rule."""
    clock = Clock(now=time.time()).install(monkeypatch, lag_mod)
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)
    fake_log.read_all(1)
    fake_log.ends[(TOPIC, 0)] = fake_log.checkpoint[(TOPIC, 0)] = 100
    fake_log.ends[(TOPIC, 1)] += 3                         # 3 records behind, the threshold is 3
    k.settings = k.settings.model_copy(update={"readiness_window_seconds": 1e9})
    rs = [readiness(k.version(PIPELINE, v), threshold=3) for _ in range(4)]   # no micro-batch commits meanwhile
    assert [r.consecutive_ok for r in rs] == [1, 1, 1, 1]
    assert rs[-1].reason == "1 of 3 samples a micro-batch apart with lag <= 3 records and <= 60 s behind"
    fake_log.read_all()                                   # nothing left to read: the trigger interval spaces
    rs = []
    for _ in range(3):
        rs += [readiness(k.version(PIPELINE, v)), readiness(k.version(PIPELINE, v))]
        clock.now += 0.5
    assert [r.consecutive_ok for r in rs] == [1, 1, 1, 1, 2, 2]
    clock.now += 0.5
    rs = [readiness(k.version(PIPELINE, v)) for _ in range(2)] + samples_a_batch_apart(k, v, 3)
    assert [(r.state, r.consecutive_ok) for r in rs] == [("ready", 3)] * 5   # never 4/3 or 6/3
    assert len(rs[-1].samples) == 3


def test_ready_moves_to_caught_up_and_records_the_rule_and_the_samples_behind_it(k, fake_log):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)
    fake_log.read_all()
    r = samples_a_batch_apart(k, v, 3)[-1]
    assert r.ready and r.consecutive_ok == 3 and r.required_samples == 3 and r.threshold == 0
    assert [s["total"] for s in r.samples] == [0, 0, 0] and [s["batches"] for s in r.samples] == [7, 6, 5]
    assert k.registry.get_version(PIPELINE, v).state == "caught_up"
    (entry,) = k.registry.audit_log(PIPELINE, action="caught_up")
    assert [s["total"] for s in entry.details["samples"]] == [0, 0, 0]
    assert (entry.details["threshold"], entry.details["catchup_seconds"], entry.details["required_samples"],
            entry.details["counted"], entry.details["batches"], entry.details["growing"]) == (0, 60.0, 3, 3, 7, False)
    assert entry.details["rule"] == r.rule == (
        "lag <= 0 records and <= 60 s behind in 3 samples a micro-batch apart (or 1 s apart with nothing to "
        "read), all after a micro-batch committed since the job started, the lag not growing across them (by more "
        "than a tenth of the threshold)")


def test_unknown_lag_breaks_the_run_and_never_counts(k, fake_log):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)
    fake_log.read_all()
    samples_a_batch_apart(k, v, 2)
    fake_log.down = True
    r = samples_a_batch_apart(k, v, 1)[0]
    assert r.state == "hydrating" and r.total_lag is None and r.consecutive_ok == 0
    assert "lag unknown" in r.reason and "never counts" in r.reason
    fake_log.down = False
    assert samples_a_batch_apart(k, v, 1)[0].consecutive_ok == 1   # the unknown one broke the run


def test_threshold_override_from_the_deploy(k, fake_log):
    v = allocate(k, threshold=60).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)
    fake_log.read_all(0)  # lag 50 on partition 1
    r = samples_a_batch_apart(k, v, 3)[-1]
    assert r.ready and r.threshold == 60 and r.total_lag == 50


def test_failed_job_is_failing_and_left_to_the_supervisor(k, fake_log):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v, state="failed", error="SinkError: disk full")
    fake_log.read_all()
    r = readiness(k.version(PIPELINE, v))
    assert r.state == "failing" and "disk full" in r.reason
    # readiness only says so: restarting the job or failing the version is the supervisor's decision
    rec = k.registry.get_version(PIPELINE, v)
    assert rec.state == "backfilling" and rec.error is None


def test_stale_heartbeat_is_failing(k, fake_log):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v, heartbeat_age=120)
    r = readiness(k.version(PIPELINE, v), record=False)
    assert r.state == "failing" and "heartbeat is 120 s old" in r.reason


def test_lagging_after_it_had_caught_up(k, fake_log):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "caught_up")
    fake_running(k, v)
    r = readiness(k.version(PIPELINE, v))
    assert r.state == "lagging" and r.total_lag == 150


def test_record_false_writes_nothing(k, fake_log):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "starting")
    fake_running(k, v)
    readiness(k.version(PIPELINE, v), record=False)
    assert k.registry.lag_samples(PIPELINE, v) == []
    assert k.registry.get_version(PIPELINE, v).state == "starting"


def test_wait_ready_timeout_names_the_lagging_partitions(k, fake_log):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)
    fake_log.read_all(1)  # partition 0 still 100 behind
    with pytest.raises(NotReadyError) as e:
        wait_ready(k.version(PIPELINE, v), deadline_seconds=0.3, poll_seconds=0.1)
    msg = str(e.value)
    assert f"{PIPELINE} v{v} is not ready after" in msg
    assert f"total lag 100 records, 2 s behind, partitions over the threshold 0: {TOPIC}:0=100;" in msg
    assert f"{TOPIC}:1" not in msg.split("partitions over")[1].split(";")[0]


def test_wait_ready_returns_once_ready_and_reports_each_sample(k, fake_log):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)
    fake_log.read_all()
    seen = []

    def sampled(r):                     # the job commits a micro-batch between two samples
        seen.append(r)
        commit_batch(k, v)
    r = wait_ready(k.version(PIPELINE, v), deadline_seconds=30, poll_seconds=0.01, on_sample=sampled)
    assert r.ready and [x.consecutive_ok for x in seen] == [1, 2, 3]


def test_wait_ready_fails_at_once_when_the_job_fails(k, fake_log):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v, state="failed", error="RulesError: bad rule")
    with pytest.raises(NotReadyError, match=rf"{PIPELINE} v{v} cannot become ready: the job reported "
                                            r"failure: RulesError: bad rule"):
        wait_ready(k.version(PIPELINE, v), deadline_seconds=600, poll_seconds=5)


@pytest.mark.parametrize("lag", [5, 6])
def test_a_sample_at_the_threshold_counts_and_one_over_does_not(k, fake_log, lag):
    v = allocate(k, threshold=5).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)
    fake_log.read_all()
    fake_log.ends[(TOPIC, 1)] += lag
    rs = samples_a_batch_apart(k, v, 3)
    assert [r.total_lag for r in rs] == [lag] * 3
    if lag == 5:
        assert [(r.state, r.consecutive_ok, r.reason) for r in rs] == [
            ("hydrating", 1, "1 of 3 samples a micro-batch apart with lag <= 5 records and <= 60 s behind"),
            ("hydrating", 2, "2 of 3 samples a micro-batch apart with lag <= 5 records and <= 60 s behind"),
            ("ready", 3, "lag <= 5 records and <= 60 s behind in 3 samples a micro-batch apart, not growing, "
                         "7 micro-batches since the job started, job running")]
        assert k.registry.get_version(PIPELINE, v).state == "caught_up"
    else:
        assert [(r.state, r.consecutive_ok, r.reason) for r in rs] == [("hydrating", 0, "lag 6 > threshold 5 records")] * 3
        assert k.registry.get_version(PIPELINE, v).state == "backfilling"
        assert k.registry.audit_log(PIPELINE, action="caught_up") == []


def test_only_samples_since_the_jobs_current_start_count(k, fake_log):
    """A restarted job's samples from before its start (its previous run) are not part of the run."""
    # The job's start is this test process's: older than the readiness window when the suite runs long.
    k.settings = k.settings.model_copy(update={"readiness_window_seconds": 1e9})
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)
    started = psutil.Process().create_time() + 0.25   # the launch's wall clock trails the creation time
    (k.paths(PIPELINE, v).launch_file).write_text(json.dumps(
        {"pid": os.getpid(), "mode": "local", "created": psutil.Process().create_time(), "started_at": started}))
    k.registry.add_lag_sample(PIPELINE, v, 0, {}, at=started - 0.5, lag_seconds=0.0, batches=2)   # the previous run's
    k.registry.add_lag_sample(PIPELINE, v, 0, {}, at=started + 0.5, lag_seconds=0.0, batches=3)   # this run's
    fake_log.read_all()
    r = readiness(k.version(PIPELINE, v))
    assert (r.state, r.consecutive_ok) == ("hydrating", 2)
    assert [s["at"] for s in r.samples][1:] == [started + 0.5]
    assert samples_a_batch_apart(k, v, 1)[0].state == "ready"


def test_wait_ready_deadline_and_poll_are_seconds(k, fake_log, monkeypatch):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)
    fake_log.read_all(1)  # partition 0 stays 100 behind
    clock = Clock().install(monkeypatch, await_ready)
    with pytest.raises(NotReadyError) as e:
        wait_ready(k.version(PIPELINE, v), deadline_seconds=10, poll_seconds=2)
    assert clock.slept == [2.0] * 5   # samples at 0, 2, 4, 6, 8 and 10 s; the next would pass the deadline
    assert str(e.value).startswith(f"{PIPELINE} v{v} is not ready after 10 s (hydrating): total lag 100 records, 2 s "
                                   f"behind")
    assert len(k.registry.lag_samples(PIPELINE, v)) == 6


def test_a_requested_stop_in_progress_is_not_failing_but_a_running_version_whose_job_stops_is(k, fake_log):
    fake_log.read_all()
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "caught_up")
    k.registry.set_state(PIPELINE, v, "stopped")          # request_stop marks the state first
    fake_running(k, v, state="stopping")                  # the job finishes its micro-batch meanwhile
    r = readiness(k.version(PIPELINE, v))
    assert (r.state, r.job_health) == ("lagging", "stopping")
    assert "stopping" in r.reason and "stop requested" in r.reason
    assert k.registry.get_version(PIPELINE, v).state == "stopped"
    k.registry.set_state(PIPELINE, v, "standby")
    r = readiness(k.version(PIPELINE, v))
    assert r.state == "failing" and "stopping" in r.reason
