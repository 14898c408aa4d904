"""Lag arithmetic, unknown lag, samples and ETA (no broker: a fake log)."""

from __future__ import annotations

import pytest

from control_helpers import PIPELINE, TOPIC, allocate
from orchestrator.observe.lag import eta_seconds, format_partitions, lag_from_offsets, measure_lag, sample_lag


def test_lag_is_end_minus_checkpoint_per_partition():
    logs = {(TOPIC, 0): (0, 100), (TOPIC, 1): (0, 50)}
    r = lag_from_offsets(PIPELINE, 1, logs, {(TOPIC, 0): 60, (TOPIC, 1): 50}, {(TOPIC, 0): 55})
    assert r.partitions == {f"{TOPIC}:0": 40, f"{TOPIC}:1": 0}
    assert r.total == 40
    assert r.source == "checkpoint"
    by_p = {d.partition: d for d in r.details}
    assert by_p[0].group_offset == 55 and by_p[0].next_offset == 60  # the group only cross-checks


def test_no_checkpoint_means_next_offset_is_log_start_not_unknown():
    logs = {(TOPIC, 0): (10, 100), (TOPIC, 1): (0, 50)}
    r = lag_from_offsets(PIPELINE, 1, logs, None, {})
    assert r.total == 90 + 50
    assert r.source == "log-start"
    assert r.known


def test_group_offsets_are_the_fallback_when_no_checkpoint():
    logs = {(TOPIC, 0): (0, 100), (TOPIC, 1): (0, 50)}
    r = lag_from_offsets(PIPELINE, 1, logs, None, {(TOPIC, 0): 70, (TOPIC, 1): 50})
    assert r.source == "group"
    assert r.total == 30


def test_partition_added_after_the_checkpoint_counts_from_log_start():
    logs = {(TOPIC, 0): (0, 100), (TOPIC, 1): (0, 50), (TOPIC, 2): (0, 7)}
    r = lag_from_offsets(PIPELINE, 1, logs, {(TOPIC, 0): 100, (TOPIC, 1): 50})
    assert r.partitions[f"{TOPIC}:2"] == 7
    assert r.total == 7


def test_measure_lag_reads_the_fake_log(k, fake_log):
    v = allocate(k).version
    assert measure_lag(k.version(PIPELINE, v)).total == 150
    fake_log.read_all(0)
    r = measure_lag(k.version(PIPELINE, v))
    assert (r.total, r.source, r.batch_id) == (50, "checkpoint", 7)


def test_broker_down_gives_unknown_lag_stored_as_unknown(k, fake_log):
    v = allocate(k).version
    fake_log.down = True
    r = sample_lag(k.version(PIPELINE, v))
    assert r.total is None and not r.known
    assert "cannot read log end offsets" in r.error
    stored = k.registry.lag_samples(PIPELINE, v)
    assert [s.total for s in stored] == [None]


def test_sample_lag_stores_total_and_partitions(k, fake_log):
    v = allocate(k).version
    fake_log.read_all(1)
    sample_lag(k.version(PIPELINE, v))
    (s,) = k.registry.lag_samples(PIPELINE, v)
    assert s.total == 100
    assert s.partitions == {f"{TOPIC}:0": 100, f"{TOPIC}:1": 0}


def test_eta_from_the_recent_rate():
    samples = [{"at": 100.0, "total": 1000}, {"at": 110.0, "total": 800}, {"at": 120.0, "total": 600}]
    assert eta_seconds(samples) == pytest.approx(30.0)          # 20 records/s, 600 left
    assert eta_seconds(samples, threshold=200) == pytest.approx(20.0)


@pytest.mark.parametrize("samples", [
    [],
    [{"at": 1.0, "total": 500}],                                   # one sample: no rate
    [{"at": 1.0, "total": 500}, {"at": 2.0, "total": 600}],        # growing: no ETA
    [{"at": 1.0, "total": 500}, {"at": 2.0, "total": None}],       # unknown now: no ETA
])
def test_no_eta_without_a_falling_known_lag(samples):
    assert eta_seconds(samples) is None


def test_eta_is_zero_at_the_threshold_and_ignores_samples_before_the_start():
    assert eta_seconds([{"at": 1.0, "total": 9}, {"at": 2.0, "total": 0}]) == 0.0
    old_run = [{"at": 1.0, "total": 10_000}, {"at": 50.0, "total": 400}, {"at": 60.0, "total": 300}]
    assert eta_seconds(old_run, since=40.0) == pytest.approx(30.0)


def test_format_partitions_largest_first():
    assert format_partitions({"t:0": 3, "t:1": 40, "t:2": None}) == "t:2=unknown, t:1=40, t:0=3"
