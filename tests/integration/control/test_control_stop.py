"""A stop that stops (issue 30, item 3), on a standardize job spawned by the orchestrator (Spark).

A stop is requested while a slow micro-batch runs: the batch is held before its commits by the hold hook
(`KAPPA_TEST_HOLD_BEFORE_COMMIT`), more records arrive meanwhile, so the next batch is due the moment the
held one commits. The job must end after the held batch (its commit lands), start no new batch that does
work (nothing of the next batch is committed anywhere), and end `stopped` well before the stop's bound.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from control_live import DEADLINE, PARTITIONS, PIPELINE, Live, make_spec
from jobs.lib.sink.batches import HOLD_FILE, HOLD_HOOK
from orchestrator.context import Kappa
from orchestrator.core.paths import app_id
from orchestrator.core.settings import Settings
from orchestrator.dev import datagen
from orchestrator.jobctl import inspect_version, stop_version
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.registry import Registry
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

BOUND = 300.0      # the stop's bound (stop_timeout_seconds): far above what the held batch takes here


def _batches(checkpoint: Path, folder: str) -> set[int]:
    return {int(p.name) for p in (checkpoint / folder).iterdir() if p.name.isdigit()}


def test_a_stop_requested_during_a_slow_batch_ends_after_it_before_the_bound(broker, tmp_path, seed, monkeypatch):
    from deltalake import DeltaTable

    unique = uuid.uuid4().hex[:8]
    topic, alias = f"profiles_{unique}", f"profiles_std_{unique}"
    datagen.ensure_topic(broker.bootstrap_servers, topic, PARTITIONS)
    reg = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    k = Kappa(Settings(home=tmp_path / "home", bootstrap_servers=broker.bootstrap_servers), registry=reg,
              pipelines={PIPELINE: make_spec(topic, alias, stop_timeout_seconds=BOUND, catchup_seconds=3600.0)})
    live = Live(broker.bootstrap_servers, topic, alias, tmp_path / "home", k, seed=seed)
    held = tmp_path / "held"
    try:
        live.produce(300, 100, first_new=True)
        monkeypatch.setenv(HOLD_HOOK, "1")                 # the first live batch, after the backfill (batch 0)
        monkeypatch.setenv(HOLD_FILE, str(held))
        info = deploy(k, k.pipeline(PIPELINE), "v1", actor="tests", reason="a job to stop")
        wait_ready(k.version(PIPELINE, info.version), deadline_seconds=DEADLINE, poll_seconds=1)
        paths = k.paths(PIPELINE, info.version)
        checkpoint = Path(paths.checkpoint)
        live.produce(50, 100)                              # batch 1 reads these, and is held before its commits
        wait_until(held.exists, "micro-batch 1 to be read and held", DEADLINE, poll=0.2)

        result: list = []
        stopper = threading.Thread(target=lambda: result.append(stop_version(
            k.version(PIPELINE, info.version), actor="kappa-monitor", reason="standby grace period over")), daemon=True)
        stopper.start()
        wait_until(lambda: inspect_version(k.version(PIPELINE, info.version)).state, "the job to take the stop request",
                   60, poll=0.2, done=lambda state: state == "stopping")
        live.produce(50, 100)                              # batch 2 is due as soon as batch 1 commits
        assert stopper.is_alive() and inspect_version(k.version(PIPELINE, info.version)).alive   # it waits for batch 1
        assert 1 not in _batches(checkpoint, "commits")
        held.unlink()                                      # batch 1 goes on to its commits
        stopper.join(DEADLINE)
        assert not stopper.is_alive(), "the stop did not return"
    finally:
        held.unlink(missing_ok=True)
        live.close()

    (res,) = result
    assert (res.how, res.final_state, res.killed_at_bound) == ("graceful", "stopped", False), res
    assert res.seconds < BOUND and res.bound_seconds == BOUND
    assert f"within its bound of {BOUND:g} s" in res.message, res.message
    st = inspect_version(k.version(PIPELINE, info.version))
    assert (st.health, st.alive) == ("stopped", False)
    assert k.registry.get_version(PIPELINE, info.version).state == "stopped"
    # batch 1 committed (Spark and Delta); nothing of batch 2 did: planned at most, it runs at the next start
    assert max(_batches(checkpoint, "commits")) == 1
    assert DeltaTable(str(paths.table)).transaction_version(app_id(PIPELINE, info.version)) == 1
    log = paths.log_file.read_text()
    assert (f", bound {BOUND:g} s: standby grace period over; micro-batch 1 in flight finishes, and no new micro-batch "
            f"starts") in log and "stop requested by kappa-monitor at " in log
    assert "query stopped " in log and "after micro-batch 1" in log
    stop = k.registry.audit_log(PIPELINE, action="stop", version=info.version)[-1]
    assert (stop.details["how"], stop.details["killed_at_bound"], stop.details["bound_seconds"]) == \
        ("graceful", False, BOUND)
    reg.close()
