"""The standardize job's one-batch backfill shows its read progress in the version's lag (records
and seconds) before it commits, and the version is not ready until it commits. Real broker,
standardize job spawned by the control plane, registry and readiness as in production.

The job is held between reading its backfill (its scan tasks done, the batch parsed and counted)
and its Delta commits by the test hook it shares with the seed jobs (`jobs.lib.sink.batches.HOLD_HOOK`):
the interleaving is forced, not raced. The driver turns the scan's finished tasks into a read
position per partition (`jobs.lib.runtime.backfill`).
"""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from jobs.lib.sink.batches import HOLD_FILE, HOLD_HOOK
from jobs.lib.source.read_progress import progress_dir, read_progress
from orchestrator.context import Kappa
from orchestrator.core.pipelines import load_pipelines
from orchestrator.core.settings import Settings
from orchestrator.core.states import VersionState
from orchestrator.dev import seedgen
from orchestrator.jobctl import inspect_version, stop_version
from orchestrator.lifecycle.await_ready import readiness, wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.observe.lag import group_offsets, measure_lag
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
DECLARED = load_pipelines(REPO / "deploy" / "pipelines.toml")
DEADLINE = float(os.environ.get("KAPPA_TEST_READY_DEADLINE", "900"))
MAX_LAG_SECONDS = 60.0
PIPELINE = "standardize"


@pytest.fixture
def held_standardize(bootstrap, tmp_path, monkeypatch):
    """standardize deployed on a fresh profile changelog of 1200 records with timestamps hours old,
    its backfill held before its Delta commit."""
    made: list[tuple[Kappa, int]] = []

    def start():
        topic = f"rp_profiles_{uuid.uuid4().hex[:8]}"
        seedgen.create_topics(bootstrap, {topic: 2}, compacted=[topic])
        begin = datetime.now(timezone.utc) - timedelta(hours=3)   # record timestamps: lag in seconds is real
        records = seedgen.member_profiles(topic, seedgen.member_ids(300), begin, updates=900,
                                          spacing=timedelta(seconds=5))
        produced = seedgen.produce(bootstrap, records)
        spec = DECLARED[PIPELINE].model_copy(update={
            "topics": (topic,), "alias": f"rp_std_{uuid.uuid4().hex[:8]}", "catchup_threshold": 0,
            "catchup_seconds": MAX_LAG_SECONDS, "options": {}})
        settings = Settings(home=tmp_path / "home", bootstrap_servers=bootstrap,
                            group_prefix=f"kt-{uuid.uuid4().hex[:8]}")
        k = Kappa(settings, pipelines={PIPELINE: spec})
        held = tmp_path / "held"
        monkeypatch.setenv(HOLD_HOOK, "0")
        monkeypatch.setenv(HOLD_FILE, str(held))
        info = deploy(k, k.pipeline(PIPELINE), "v1", actor="tests", reason="read progress of the backfill", force=True)
        made.append((k, info.version))
        return k, info.version, held, produced

    try:
        yield start
    finally:
        for k, version in made:
            if inspect_version(k.version(PIPELINE, version)).alive:
                stop_version(k.version(PIPELINE, version), actor="tests", reason="test teardown", force=True,
                             graceful_timeout=20, final_state=None)
            k.close()


def test_standardize_lag_goes_down_during_the_backfill_and_ready_waits_for_its_commit(held_standardize):
    k, version, held, produced = held_standardize()
    total = len(produced)
    assert k.pipeline(PIPELINE).catchup_seconds == MAX_LAG_SECONDS
    # Taken as the job starts: Spark's start-up alone outlasts it, so nothing is read yet.
    first = measure_lag(k.version(PIPELINE, version))
    assert (first.total, first.source) == (total, "log-start")
    assert first.lag_seconds > 2 * 3600

    wait_until(lambda: held.exists() or inspect_version(k.version(PIPELINE, version)).failed,
               "the backfill to be read and held before its Delta commit", 300)
    assert held.exists(), inspect_version(k.version(PIPELINE, version)).error
    paths = k.paths(PIPELINE, version)
    during = [readiness(k.version(PIPELINE, version), record=True) for _ in range(k.pipeline(PIPELINE).catchup_samples + 2)]
    for r in during:
        # everything is read: the partitions show it, the total and the seconds stay just over the rule
        assert r.lag_source == "reading" and set(r.partitions.values()) == {0}
        assert (r.total_lag, r.lag_seconds) == (1, MAX_LAG_SECONDS + 1)
        # a floor, shown as one, with no ETA (it would say "0 s" for a lag that is not the lag)
        assert r.floored and r.eta_seconds is None
        assert r.lag_text() == "≥ 1 (first batch not yet committed; 0 left to read)"
        assert r.state == "hydrating" and not r.ready and r.job_health == "running"
    assert k.registry.get_version(PIPELINE, version).state == VersionState.BACKFILLING
    # each partition reported read to its end: 1200 offsets over 2 partitions
    (batch,) = read_progress(paths.checkpoint)
    assert batch.scans == 1 and sum(e - s for _t, _p, s, e in batch.reads) == total
    assert len(batch.reads) == 2 and sum(batch.reads.values()) == total
    # `kappa status` shows it too (the job's heartbeat writes it)
    wait_until(lambda: inspect_version(k.version(PIPELINE, version)).reading, "the job status to show the read backfill",
               30, done=lambda r: r == {"batch_id": 0, "records_read": total, "records_total": total})
    stored = [s.total for s in k.registry.lag_samples(PIPELINE, version)]
    assert stored[-len(during):] == [1] * len(during) and max(stored) < total
    # the consumer group and the checkpoint still say "nothing committed": the log start, or nothing yet
    assert set(group_offsets(k, paths.group_id, k.pipeline(PIPELINE).topics).values()) <= {0}
    assert not (Path(paths.checkpoint) / "commits" / "0").exists()

    held.unlink()   # the batch commits
    ready = wait_ready(k.version(PIPELINE, version), deadline_seconds=DEADLINE, poll_seconds=1)
    assert (ready.total_lag, ready.lag_source, ready.lag_seconds) == (0, "checkpoint", 0.0)
    wait_until(lambda: inspect_version(k.version(PIPELINE, version)).reading, "the status to drop the reading", 30,
               done=lambda r: r is None)
    where = progress_dir(paths.checkpoint)
    wait_until(lambda: os.listdir(where) if os.path.exists(where) else [],
               "the backfill's read progress dropped once committed", 60, done=lambda left: left == [])
