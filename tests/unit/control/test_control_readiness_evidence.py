"""Issue 30, item 1: "caught up" from evidence. A job restarted from its checkpoint shows the lag of that
checkpoint, which may be under the threshold while the job has not processed anything yet; samples of it
count only once the job has committed a micro-batch since its start, a micro-batch apart, and not while
the lag grows."""

from __future__ import annotations

import json
import time

from control_helpers import PIPELINE, TOPIC, allocate, fake_running
from orchestrator.lifecycle.await_ready import readiness


def _commit(k, v: int) -> None:
    """The job reports one more micro-batch committed since it started (its status's `batches`)."""
    path = k.paths(PIPELINE, v).status_file
    data = json.loads(path.read_text())
    data.update(batches=data["batches"] + 1, heartbeat_at=time.time())
    path.write_text(json.dumps(data))


def _restarted(k, fake_log, behind: int) -> int:
    """A version restarted from its checkpoint (`behind` records to read): its query runs, nothing committed yet."""
    v = allocate(k).version
    k.registry.set_state(PIPELINE, v, "starting")
    fake_log.read_all()
    fake_log.ends[(TOPIC, 0)] += behind
    fake_running(k, v, batches=0, batch_id=None)
    return v


def test_a_restarted_job_is_not_ready_before_it_commits_a_micro_batch(k, fake_log):
    v = _restarted(k, fake_log, behind=100)
    rs = [readiness(k.version(PIPELINE, v), threshold=150) for _ in range(5)]   # lag 100, under the threshold 150
    assert [(r.state, r.total_lag, r.job_health) for r in rs] == [("hydrating", 100, "running")] * 5
    assert rs[-1].reason.startswith("no micro-batch committed since its job started")
    assert rs[-1].consecutive_ok == 0 and rs[-1].batches == 0
    assert k.registry.audit_log(PIPELINE, action="caught_up") == []
    _commit(k, v)                                         # its first micro-batch commits: evidence from here on
    fake_log.ends[(TOPIC, 0)] -= 50                       # (the records it committed; 50 arrived meanwhile)
    rs = []
    for _ in range(3):
        rs.append(readiness(k.version(PIPELINE, v), threshold=150))
        _commit(k, v)
    assert [(r.state, r.consecutive_ok) for r in rs] == [("hydrating", 1), ("hydrating", 2), ("ready", 3)]
    assert [s["batches"] for s in rs[-1].samples] == [3, 2, 1]


def test_a_growing_lag_is_not_caught_up_even_under_the_threshold(k, fake_log):
    """677 -> 783 -> 799 records, all under 1,000: not caught up while it grows."""
    v = _restarted(k, fake_log, behind=0)
    rs = []
    for lag in (677, 783, 799):
        _commit(k, v)
        fake_log.read_all()
        fake_log.ends[(TOPIC, 0)] += lag
        rs.append(readiness(k.version(PIPELINE, v), threshold=1000))
    assert [(r.ready, r.consecutive_ok, r.growing) for r in rs] == [(False, 1, False), (False, 2, True),
                                                                      (False, 3, True)]
    assert rs[-1].reason == "lag grew across the last 3 samples (677 -> 799 records)"
    for lag in (700, 650):                                # it falls again: the last three no longer grow
        _commit(k, v)
        fake_log.read_all()
        fake_log.ends[(TOPIC, 0)] += lag
        r = readiness(k.version(PIPELINE, v), threshold=1000)
    assert (r.state, r.growing, [s["total"] for s in r.samples]) == ("ready", False, [650, 700, 799])


def test_a_live_tails_lag_moving_by_a_few_records_is_not_growing(k, fake_log):
    """The kappa up walk's promote was refused for '16 -> 30 records' under a threshold of 1,000: noise."""
    v = _restarted(k, fake_log, behind=0)
    rs = []
    for lag in (16, 22, 30, 40, 12, 30):
        _commit(k, v)
        fake_log.read_all()
        fake_log.ends[(TOPIC, 0)] += lag
        rs.append(readiness(k.version(PIPELINE, v), threshold=1000))
    assert [(r.ready, r.growing) for r in rs] == [(False, False), (False, False)] + [(True, False)] * 4
