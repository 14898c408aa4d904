"""kappa_throttle's task: the same verb as `kappa throttle`, recorded as airflow:<user> with the run."""

from __future__ import annotations

import pytest

from orchestrator.airflow import throttle_tasks
from orchestrator.core.exceptions import RefusedError

pytestmark = pytest.mark.airflow

PIPELINES = '[pipelines.std_a]\njob = "standardize"\ntopics = ["profiles_a"]\nkey = "member_id"\nalias = "std_a_served"\n'


@pytest.fixture
def k(tmp_path, monkeypatch):
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(PIPELINES)
    monkeypatch.setenv("KAPPA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KAPPA_PIPELINES", str(pipelines))
    for var in ("KAPPA_REGISTRY_URL", "KAPPA_CONFIG", "AIRFLOW_CTX_DAG_ID"):
        monkeypatch.delenv(var, raising=False)
    from orchestrator.airflow.tasks import task_kappa

    with task_kappa() as kk:
        rec = kk.registry.allocate_version("std_a", rules_version=None, rules_hash=None, code_ref="t",
                                           paths=lambda n: kk.paths("std_a", n), actor="t", reason="r")
        kk.registry.set_state("std_a", rec.version, "backfilling")
        yield kk


def test_the_task_sets_the_share_and_the_audit_names_the_user_and_the_run(k):
    res = throttle_tasks.throttle("std_a", 1, 0.4, False, "peak hours", user="alice", run_id="manual__1")
    assert (res["to"], res["mode"]) == (0.4, "fixed")
    (e,) = k.registry.audit_log("std_a", action="throttle")
    assert e.actor == "airflow:alice" and e.reason == "operator: peak hours [airflow kappa_throttle run manual__1]"
    res = throttle_tasks.throttle("std_a", 1, 0.9, True, None, user="alice", run_id="manual__2")
    assert (res["to"], res["mode"]) == (0.4, "adaptive")          # adaptive: the form's share is ignored


def test_the_task_refuses_the_serving_version(k):
    k.registry.set_state("std_a", 1, "caught_up")
    k.registry.flip_alias("std_a_served", "std_a", expected_version=None, new_version=1, actor="t", reason="r",
                          serve=True)
    with pytest.raises(RefusedError, match="is serving"):
        throttle_tasks.throttle("std_a", 1, 0.4, False, None, user="alice", run_id="r")
