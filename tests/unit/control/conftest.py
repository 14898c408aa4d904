"""Fixtures of the control-plane unit tests: a real SQLite registry in tmp_path, a declared
pipeline, a fake log (the broker's offsets, the group's and the checkpoint's, no broker), and
fake job processes that follow the runtime's status/STOP contract without Spark."""

import pytest
from control_helpers import fake_jobs, fake_log, k, spec  # noqa: F401  (fixtures)


@pytest.fixture(autouse=True)
def _quick_estimate(monkeypatch):
    """A deploy estimates its backfill from the broker's log offsets; where a test fakes the topic checks and no
    broker listens (127.0.0.1:9), that ask would wait its whole timeout before the estimate says unknown."""
    from orchestrator.observe import estimate

    monkeypatch.setattr(estimate, "ESTIMATE_TIMEOUT", 0.3)
    # the fake jobs' pid is this test process: a deploy would sample pytest's own CPU for a second
    monkeypatch.setattr(estimate, "running_cores", lambda records, seconds=None: (None, None))
