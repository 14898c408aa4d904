"""A seed job's one-batch backfill shows its read progress in the version's lag before it commits,
and the version is not ready until it commits (issue 8, item 3). Real broker, Spark job spawned by
the control plane, registry and readiness as in production.

The job is held between reading its backfill and committing it by the seed jobs' test hook
(`jobs.lib.sink.batches.HOLD_HOOK`): the interleaving is forced, not raced. pageviews_hourly reads
every range twice (its rejects branch is a second scan of the source), which the progress counts.
"""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from jobs.lib.sink.batches import HOLD_FILE, HOLD_HOOK
from jobs.lib.source.read_progress import progress_dir
from orchestrator.context import Kappa
from orchestrator.core.pipelines import load_pipelines
from orchestrator.core.settings import Settings
from orchestrator.core.states import VersionState
from orchestrator.dev import seedgen
from orchestrator.jobctl import inspect_version
from orchestrator.lifecycle.await_ready import readiness, wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.observe.lag import group_offsets, measure_lag
from tests.waiting import wait_until
from tests.teardown import kill_jobs

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
DECLARED = load_pipelines(REPO / "deploy" / "pipelines.toml")
DEADLINE = float(os.environ.get("KAPPA_TEST_READY_DEADLINE", "900"))
MAX_LAG_SECONDS = 60.0


@pytest.fixture
def held_version(bootstrap, tmp_path, monkeypatch):
    """pageviews_hourly deployed on a fresh topic of `count` views, its backfill held before commit."""
    made: list[tuple[Kappa, str, int]] = []

    def start(count: int):
        topic = f"rp_page_views_{uuid.uuid4().hex[:8]}"
        seedgen.create_topics(bootstrap, {topic: 2})
        begin = datetime.now(timezone.utc) - timedelta(hours=3)   # record timestamps: lag in seconds is real
        views = seedgen.page_views(topic, seedgen.member_ids(6), count, begin, spacing=timedelta(seconds=5))
        produced = seedgen.produce(bootstrap, views)
        spec = DECLARED["pageviews_hourly"].model_copy(update={
            "topics": (topic,), "alias": f"rp_{uuid.uuid4().hex[:8]}", "catchup_seconds": MAX_LAG_SECONDS})
        settings = Settings(home=tmp_path / "home", bootstrap_servers=bootstrap,
                            group_prefix=f"kt-{uuid.uuid4().hex[:8]}")
        k = Kappa(settings, pipelines={"pageviews_hourly": spec})
        held = tmp_path / "held"
        monkeypatch.setenv(HOLD_HOOK, "0")
        monkeypatch.setenv(HOLD_FILE, str(held))
        info = deploy(k, k.pipeline("pageviews_hourly"), actor="tests", reason="read progress of the backfill", force=True)
        made.append((k, "pageviews_hourly", info.version))
        return k, info.version, held, produced

    try:
        yield start
    finally:
        for k, pipeline, version in made:
            kill_jobs(k, [pipeline])
            k.close()


def test_lag_goes_down_during_the_backfill_and_ready_waits_for_its_commit(held_version, bootstrap):
    k, version, held, produced = held_version(1200)
    pipeline = "pageviews_hourly"
    assert k.pipeline(pipeline).catchup_seconds == MAX_LAG_SECONDS
    # Taken as the job starts: Spark's start-up alone outlasts it, so nothing is read yet.
    first = measure_lag(k.version(pipeline, version))
    assert (first.total, first.source) == (len(produced), "log-start")
    assert first.lag_seconds > 2 * 3600

    wait_until(lambda: held.exists() or inspect_version(k.version(pipeline, version)).failed,
               "the backfill to be read and held before its commit", 300)
    assert held.exists(), inspect_version(k.version(pipeline, version)).error
    during = [readiness(k.version(pipeline, version), record=True) for _ in range(k.pipeline(pipeline).catchup_samples + 2)]
    for r in during:
        # everything is read: the partitions show it, the total and the seconds stay just over the rule
        assert r.lag_source == "reading" and set(r.partitions.values()) == {0}
        assert (r.total_lag, r.lag_seconds) == (1, MAX_LAG_SECONDS + 1)
        # a floor, shown as one, with no ETA (it would say "0 s" for a lag that is not the lag)
        assert r.floored and r.eta_seconds is None
        assert r.lag_text() == "≥ 1 (first batch not yet committed; 0 left to read)"
        assert r.state == "hydrating" and not r.ready and r.job_health == "running"
    assert k.registry.get_version(pipeline, version).state == VersionState.BACKFILLING
    # `kappa status` shows it too (the job's heartbeat writes it every 2 s)
    wait_until(lambda: inspect_version(k.version(pipeline, version)).reading, "the job status to show the read backfill",
               30, done=lambda r: r == {"batch_id": 0, "records_read": len(produced), "records_total": len(produced)})
    stored = [s.total for s in k.registry.lag_samples(pipeline, version)]
    assert stored[-len(during):] == [1] * len(during) and max(stored) < len(produced)
    # the consumer group and the checkpoint still say "nothing committed": the log start, or nothing yet
    paths = k.paths(pipeline, version)
    assert set(group_offsets(k, paths.group_id, k.pipeline(pipeline).topics).values()) <= {0}
    assert not (Path(paths.checkpoint) / "commits" / "0").exists()

    held.unlink()   # the batch commits
    ready = wait_ready(k.version(pipeline, version), deadline_seconds=DEADLINE, poll_seconds=1)
    assert (ready.total_lag, ready.lag_source, ready.lag_seconds) == (0, "checkpoint", 0.0)
    # Spark tells the source of the commit when it plans the next batch; the group commit is asynchronous
    wait_until(lambda: sum(group_offsets(k, paths.group_id, k.pipeline(pipeline).topics).values()), "the group at the backfill's end", 60,
               done=lambda n: n == len(produced))
    wait_until(lambda: inspect_version(k.version(pipeline, version)).reading, "the status to drop the reading", 30,
               done=lambda r: r is None)
    wait_until(lambda: os.listdir(progress_dir(paths.checkpoint)) if os.path.exists(progress_dir(paths.checkpoint))
               else [], "the backfill's read progress dropped", 60, done=lambda left: left == [])
