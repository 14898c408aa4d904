"""A checkpoint past the log end (topic recreated) is a problem, not negative lag; old lag samples are pruned."""

from __future__ import annotations

from control_helpers import PIPELINE, TOPIC, Clock, allocate, fake_running
from orchestrator.lifecycle.await_ready import readiness
from orchestrator.observe import lag as lag_mod
from orchestrator.observe.lag import lag_from_offsets, sample_lag


def test_a_checkpoint_past_the_log_end_does_not_cancel_real_lag():
    """Partition 0 was recreated (log end 40, the checkpoint at 140); partition 1 lags 100.
    The old arithmetic summed -100 + 100 = 0: caught up while 100 records behind."""
    logs = {(TOPIC, 0): (0, 40), (TOPIC, 1): (0, 150)}
    r = lag_from_offsets(PIPELINE, 3, logs, {(TOPIC, 0): 140, (TOPIC, 1): 50})
    assert r.total is None and not r.known          # never "0", so never caught up
    assert r.partitions == {f"{TOPIC}:0": None, f"{TOPIC}:1": 100}
    by_p = {d.partition: d for d in r.details}
    assert (by_p[0].lag, by_p[0].past_end, by_p[1].lag, by_p[1].past_end) == (0, 100, 100, 0)
    assert r.error == (f"the checkpoint offsets of {PIPELINE} v3 are past the log end on {TOPIC}:0 (next offset "
                       f"140, log end 40): the topic was recreated or truncated after the job read it, so this "
                       f"version's table no longer matches the log; deploy a new version (`kappa deploy "
                       f"{PIPELINE}`), which reads it from offset zero")


def test_the_group_offsets_past_the_log_end_are_the_same_problem():
    r = lag_from_offsets(PIPELINE, 1, {(TOPIC, 0): (0, 10)}, None, {(TOPIC, 0): 25})
    assert r.total is None and r.error.startswith(f"the group offsets of {PIPELINE} v1 are past the log end")


def test_a_version_whose_checkpoint_is_past_the_log_end_never_becomes_ready(k, fake_log):
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(k, v)
    fake_log.read_all()
    fake_log.ends[(TOPIC, 0)] = 30          # partition 0 recreated: its checkpoint (100) is past the end
    fake_log.checkpoint[(TOPIC, 1)] = 20    # partition 1 really lags 30: the sum used to be 30 - 70 < 0
    rs = [readiness(k.version(PIPELINE, v)) for _ in range(4)]
    assert [(r.state, r.total_lag, r.consecutive_ok) for r in rs] == [("hydrating", None, 0)] * 4
    assert "past the log end" in rs[-1].reason and "kappa deploy" in rs[-1].reason
    assert k.registry.get_version(PIPELINE, v).state == "backfilling"
    assert [s.total for s in k.registry.lag_samples(PIPELINE, v)] == [None] * 4


def test_lag_samples_older_than_the_retention_are_pruned(k, fake_log, monkeypatch):
    k.settings = k.settings.model_copy(update={"lag_sample_retention_seconds": 3600.0})
    clock = Clock().install(monkeypatch, lag_mod)
    v1, v2 = allocate(k).version, allocate(k).version
    k.registry.set_state(PIPELINE, v1, "stopped")      # not sampled any more: pruned all the same
    for v in (v1, v2):
        k.registry.add_lag_sample(PIPELINE, v, 5, {}, at=clock.now - 3600.5)   # past the retention
        k.registry.add_lag_sample(PIPELINE, v, 4, {}, at=clock.now - 3599.5)   # within it
    lag_mod._last_prune.clear()
    r = sample_lag(k.version(PIPELINE, v2))
    assert [s.at for s in k.registry.lag_samples(PIPELINE, v1)] == [clock.now - 3599.5]
    assert [(s.at, s.id) for s in k.registry.lag_samples(PIPELINE, v2)][0][0] == clock.now - 3599.5
    assert k.registry.lag_samples(PIPELINE, v2)[-1].id == r.sample_id
    # At most one prune per PRUNE_EVERY_SECONDS and registry: the next sample does not scan again ...
    clock.now += 1.0
    sample_lag(k.version(PIPELINE, v2))
    assert len(k.registry.lag_samples(PIPELINE, v1)) == 1
    # ... and the one after it does.
    clock.sleep(lag_mod.PRUNE_EVERY_SECONDS)
    sample_lag(k.version(PIPELINE, v2))
    assert k.registry.lag_samples(PIPELINE, v1) == []
    assert k.registry.prune_lag_samples(clock.now + 1) == 3   # the method alone: v2's three samples


def test_a_batch_committed_while_lag_is_measured_never_reads_as_past_the_log_end(k, fake_log, monkeypatch):
    """A live job commits a batch between the two reads of a lag measurement (forced here: right after
    one of them). Reading the log ends first and the checkpoint after made the new checkpoint look
    past the old log end: lag unknown, "the topic was recreated", and a promote refused (seen in the
    `kappa up` UI test with a live producer). The positions are read first, so it is one record of lag."""
    v = allocate(k).version
    fake_running(k, v)
    fake_log.read_all()
    real_logs, real_ckpt = lag_mod.log_offsets, lag_mod.checkpoint_next_offsets
    first: list[str] = []

    def commit_a_new_record():
        fake_log.ends[(TOPIC, 0)] += 1           # the live producer writes a record
        fake_log.read_all()                      # the job reads it and commits its batch

    def log_offsets(*a, **kw):
        out = real_logs(*a, **kw)
        if not first:
            first.append("logs")
            commit_a_new_record()
        return out

    def checkpoint_next_offsets(*a, **kw):
        out = real_ckpt(*a, **kw)
        if not first:
            first.append("checkpoint")
            commit_a_new_record()
        return out

    monkeypatch.setattr(lag_mod, "log_offsets", log_offsets)
    monkeypatch.setattr(lag_mod, "checkpoint_next_offsets", checkpoint_next_offsets)
    r = lag_mod.measure_lag(k.version(PIPELINE, v))
    assert (r.known, r.error, r.total) == (True, None, 1)
    assert first == ["checkpoint"]              # the job's positions are read before the log ends
