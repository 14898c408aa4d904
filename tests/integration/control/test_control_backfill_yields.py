"""A backfill yields while the serving version falls behind, and speeds up again once it caught up
(issue 32). Real broker, real standardize jobs spawned by the control plane, the registry, the lag
samples and the share controller's passes as the monitor runs them.

The interleaving is forced, not raced: the new version's backfill is held before its Delta commit
by the jobs' test hook (`jobs.lib.sink.batches.HOLD_HOOK`), so it is backfilling for as long as the
test needs; the serving version is held behind by SIGSTOP of its job's processes while live updates
arrive, then let go with SIGCONT. Each controller pass is the monitor's two steps for the pipeline
(a lag sample of the serving version, then `throttle_pass`); the share's effect is read back from
the kernel: the nice value of every thread of the backfill's processes.
"""

from __future__ import annotations

import os
import signal
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from jobs.lib.sink.batches import HOLD_FILE, HOLD_HOOK
from orchestrator.context import Kappa
from orchestrator.core.pipelines import load_pipelines
from orchestrator.core.settings import Settings
from orchestrator.core.shares import MIN_SHARE, share_to_nice
from orchestrator.dev import seedgen
from orchestrator.jobctl import inspect_version
from orchestrator.jobctl.priority import job_processes, thread_nice
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.throttle import throttle_changes, throttle_pass
from orchestrator.observe.lag import sample_lag
from tests.waiting import wait_until
from tests.teardown import kill_jobs

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
DECLARED = load_pipelines(REPO / "deploy" / "pipelines.toml")
DEADLINE = float(os.environ.get("KAPPA_TEST_READY_DEADLINE", "900"))
PIPELINE = "standardize"
BOUND = 3.0          # the serving version's lag in seconds the backfill yields to
ACTOR = "tests"


def _tids(pid: int) -> list[int]:
    return [int(t) for p in job_processes(pid) for t in os.listdir(f"/proc/{p}/task")
            if os.path.exists(f"/proc/{p}/task")]


def _signal_tree(pid: int, sig: int) -> list[int]:
    procs = job_processes(pid)
    for p in procs:
        os.kill(p, sig)
    return procs


@pytest.fixture
def bed(bootstrap, tmp_path, monkeypatch):
    """standardize on a fresh profile changelog, v1 serving; v2 deployed with its backfill held."""
    topic = f"by_profiles_{uuid.uuid4().hex[:8]}"
    seedgen.create_topics(bootstrap, {topic: 2}, compacted=[topic])
    members = seedgen.member_ids(200)
    seedgen.produce(bootstrap, seedgen.member_profiles(topic, members, datetime.now(timezone.utc) - timedelta(minutes=5),
                                                       updates=300, spacing=timedelta(milliseconds=100)))
    spec = DECLARED[PIPELINE].model_copy(update={
        "topics": (topic,), "alias": f"by_std_{uuid.uuid4().hex[:8]}", "catchup_threshold": 0, "catchup_seconds": 60.0,
        "options": {}, "backfill_lag_bound_seconds": BOUND, "backfill_interval_seconds": 1.0})
    settings = Settings(home=tmp_path / "home", bootstrap_servers=bootstrap, group_prefix=f"kt-{uuid.uuid4().hex[:8]}")
    k = Kappa(settings, pipelines={PIPELINE: spec})
    stopped: list[int] = []
    try:
        v1 = deploy(k, spec, "v1", actor=ACTOR, reason="serving", force=True).version
        wait_ready(k.version(spec, v1), deadline_seconds=DEADLINE, poll_seconds=1, actor=ACTOR)
        promote(k.version(spec, v1), actor=ACTOR, reason="serving")
        held = tmp_path / "held"
        monkeypatch.setenv(HOLD_HOOK, "0")
        monkeypatch.setenv(HOLD_FILE, str(held))
        v2 = deploy(k, spec, "v2", actor=ACTOR, reason="the backfill that yields", force=True).version
        monkeypatch.delenv(HOLD_HOOK)
        wait_until(lambda: held.exists() or inspect_version(k.version(spec, v2)).failed,
                   "v2's backfill read and held before its commit", 300)
        assert held.exists(), inspect_version(k.version(spec, v2)).error
        yield k, spec, topic, members, v1, v2, held, stopped
    finally:
        for n in (1, 2):
            pid = k.registry.get_version(PIPELINE, n) and k.registry.get_version(PIPELINE, n).pid
            if pid and n in stopped:
                _signal_tree(pid, signal.SIGCONT)
        if (tmp_path / "held").exists():
            (tmp_path / "held").unlink()
        kill_jobs(k, [PIPELINE])
        k.close()


def test_a_backfill_backs_off_while_the_serving_version_is_held_behind_and_speeds_up_again(bed, bootstrap):
    k, spec, topic, members, v1, v2, held, stopped = bed
    serving_pid = k.registry.get_version(PIPELINE, v1).pid
    backfill_pid = k.registry.get_version(PIPELINE, v2).pid

    def controller_pass() -> list[dict]:
        sample_lag(k.version(spec, v1))                       # what the monitor samples first
        return throttle_pass(k, spec, actor="supervisor", serving=v1)

    def share() -> float:
        t = (k.registry.get_version(PIPELINE, v2).details or {}).get("throttle") or {}
        return float(t.get("share", 1.0))

    def live_updates(n: int) -> None:
        seedgen.produce(bootstrap, seedgen.member_profiles(topic, members[:n], datetime.now(timezone.utc), seed=n))

    # the serving version follows the live log: the backfill keeps its full share
    live_updates(20)
    wait_until(lambda: sample_lag(k.version(spec, v1)).total, "v1 to apply the live updates", 120,
               done=lambda total: total == 0)
    assert throttle_pass(k, spec, actor="supervisor", serving=v1) == []
    assert share() == 1.0 and {thread_nice(t) for t in _tids(backfill_pid)} - {None} == {0}

    # held behind: its job stopped while updates arrive; the backfill backs off, pass after pass
    stopped.append(v1)
    assert _signal_tree(serving_pid, signal.SIGSTOP)
    shares = []

    def backing_off():
        live_updates(5)
        controller_pass()
        shares.append(share())
        return shares[-1]

    wait_until(backing_off, "the backfill's share to fall to a quarter while v1 is held", 120,
               done=lambda s: s <= 0.25, poll=1)
    low = share()
    assert low >= MIN_SHARE                                   # never starved to nothing
    assert all(a >= b for a, b in zip(shares, shares[1:]))    # only down while the serving version suffers
    nices = {thread_nice(t) for t in _tids(backfill_pid)} - {None}
    assert nices == {share_to_nice(low)}, nices              # every thread of its processes, in the kernel
    down = throttle_changes(k.version(spec, v2), limit=100)
    assert down and all(c["to"] < c["from"] and f"bound {BOUND:g}" in c["why"] for c in down), down

    # let go: the serving version catches up, the backfill speeds up again (it may yield a step more
    # while the serving version works through what piled up: the share falls, then only rises)
    _signal_tree(serving_pid, signal.SIGCONT)
    stopped.remove(v1)
    seen = [low]

    def recovering():
        controller_pass()
        seen.append(share())
        return seen[-1]

    wait_until(recovering, "the backfill's share to rise again once v1 caught up", 180,
               done=lambda s: s > min(seen), poll=1)
    after = [c["to"] for c in throttle_changes(k.version(spec, v2), limit=100)[len(down):]]
    bottom = after.index(min(after))
    assert after[bottom + 1:] and all(a < b for a, b in zip(after[bottom:], after[bottom + 1:])), after
    assert all(a > b for a, b in zip([low] + after[:bottom], after[:bottom + 1])), after
    assert min(after) >= MIN_SHARE
    assert {thread_nice(t) for t in _tids(backfill_pid)} - {None} == {share_to_nice(share())}
    # every change is in the audit log with its reason, and the backfill finishes once released
    held.unlink()
    wait_ready(k.version(spec, v2), deadline_seconds=DEADLINE, poll_seconds=1, actor=ACTOR)
