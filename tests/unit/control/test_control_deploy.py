"""Deploy: request checks with exact errors, allocation, resume, refusal of a second reprocess."""

from __future__ import annotations

import pytest

from control_helpers import PIPELINE, TOPIC, make_spec
from orchestrator.lifecycle import deploy as deploy_mod
from orchestrator.context import Kappa
from orchestrator.lifecycle.deploy import check_request, deploy
from orchestrator.core.exceptions import ConfigError, ConflictError, NotFoundError, RulesError, SourceError


@pytest.fixture
def kr(k):
    """The Kappa of `k` with a pipeline that takes the titles rules."""
    spec = make_spec(ruleset="titles")
    return Kappa(k.settings, registry=k.registry, pipelines={PIPELINE: spec})


@pytest.fixture
def policies(monkeypatch):
    found = {TOPIC: "compact"}
    monkeypatch.setattr(deploy_mod, "_topic_policies", lambda k, topics: {t: (found[t], found[t] is None) for t in topics})
    return found


def test_unknown_pipeline_lists_the_declared_ones(kr):
    with pytest.raises(NotFoundError) as e:
        deploy(kr, kr.pipeline("nope"), actor="alice", reason="r")
    assert str(e.value).startswith("unknown pipeline 'nope': the pipelines declared in ")
    assert str(e.value).endswith(f" are {PIPELINE}; declare it there or pick one of those")


def test_unknown_rules_version_names_the_known_ones(kr, policies):
    with pytest.raises(RulesError, match=r"ruleset 'titles' has versions v1, v2"):
        check_request(kr, kr.pipeline(PIPELINE), "v9")


def test_a_delete_policy_topic_is_refused_unless_forced(kr, policies):
    policies[TOPIC] = "delete"
    with pytest.raises(SourceError) as e:
        deploy(kr, kr.pipeline(PIPELINE), "v1", actor="alice", reason="r")
    assert str(e.value) == (
        f"source topic '{TOPIC}' of pipeline '{PIPELINE}' has cleanup.policy=delete: the broker deletes old records "
        f"of such a topic, so reading it from offset zero cannot rebuild the whole table. Set "
        f"cleanup.policy=compact on the topic, or pass --force to reprocess from what the log still holds")
    assert kr.registry.list_versions(PIPELINE) == []
    assert kr.registry.audit_log(PIPELINE, action="deploy")[-1].outcome == "refused"
    plan = check_request(kr, kr.pipeline(PIPELINE), "v1", force=True)
    assert plan.warnings and plan.warnings[0].endswith("(forced)")


def test_unset_policy_is_the_broker_default_delete(kr, policies):
    policies[TOPIC] = None
    with pytest.raises(SourceError, match=r"has no cleanup.policy \(the broker default, delete\)"):
        check_request(kr, kr.pipeline(PIPELINE), "v1")


def test_rules_of_a_pipeline_without_rules(k, policies):
    with pytest.raises(ConfigError, match=rf"pipeline '{PIPELINE}' \(job 'standardize'\) takes no rules"):
        check_request(k, k.pipeline(PIPELINE), "v1")


def test_default_rules_version_is_the_newest_and_its_hash_is_recorded(kr, policies):
    plan = check_request(kr, kr.pipeline(PIPELINE))
    assert plan.rules_version == "v2" and len(plan.rules_hash) == 64


def test_deploy_allocates_starts_and_audits(kr, policies, fake_jobs):
    info = deploy(kr, kr.pipeline(PIPELINE), "v1", actor="alice", reason="new rules", threshold=5)
    assert info.version == 1 and info.job_started and info.pid
    rec = kr.registry.get_version(PIPELINE, 1)
    assert (rec.state, rec.rules_version, rec.details["threshold"]) == ("starting", "v1", 5)
    assert rec.table_path == str(kr.paths(PIPELINE, 1).table)
    assert rec.group_id == f"kappa.{PIPELINE}.v1"
    (entry,) = kr.registry.audit_log(PIPELINE, action="deploy")
    assert (entry.actor, entry.reason, entry.outcome) == ("alice", "new rules", "ok")


def test_a_second_reprocess_is_refused_naming_the_one_in_flight(kr, policies, fake_jobs):
    deploy(kr, kr.pipeline(PIPELINE), "v1", actor="alice", reason="first")
    with pytest.raises(ConflictError, match=rf"pipeline '{PIPELINE}' already has v1 in flight"):
        deploy(kr, kr.pipeline(PIPELINE), "v2", actor="bob", reason="second")
    queued = deploy(kr, kr.pipeline(PIPELINE), "v2", actor="bob", reason="second", queue=True)
    assert queued.version == 2


def test_rerunning_the_same_deploy_is_resumable(kr, policies, fake_jobs):
    allocated = deploy(kr, kr.pipeline(PIPELINE), "v1", actor="alice", reason="r", start=False)   # died before the start
    assert kr.registry.get_version(PIPELINE, allocated.version).state == "created"
    resumed = deploy(kr, kr.pipeline(PIPELINE), "v1", actor="alice", reason="r (retry)")
    assert resumed.version == allocated.version and resumed.resumed and resumed.job_started
    again = deploy(kr, kr.pipeline(PIPELINE), "v1", actor="alice", reason="r (retry)")
    assert again.version == allocated.version and not again.job_started
    assert "already deployed and its job runs" in again.message
    assert len(kr.registry.list_versions(PIPELINE)) == 1


def test_bad_threshold(kr, policies):
    with pytest.raises(ConfigError, match="invalid catch-up threshold -1"):
        check_request(kr, kr.pipeline(PIPELINE), "v1", threshold=-1)
