"""Lag samples and the audit log, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from registry_helpers import allocate

from orchestrator.core.exceptions import NotFoundError, RegistryError

pytestmark = pytest.mark.integration


def test_lag_samples_in_time_order(registry):
    allocate(registry)
    parts = {"member_profiles": {"0": 7, "1": 3}}
    registry.add_lag_sample("standardize", 1, 10, parts, at=1000.0)
    registry.add_lag_sample("standardize", 1, None, {"member_profiles": {"0": None}}, at=1001.0)
    registry.add_lag_sample("standardize", 1, 0, {}, at=datetime.fromtimestamp(1002.0, timezone.utc))
    samples = registry.lag_samples("standardize", 1)
    assert [(s.at, s.total) for s in samples] == [(1000.0, 10), (1001.0, None), (1002.0, 0)]
    assert samples[0].partitions == parts
    assert samples[1].partitions == {"member_profiles": {"0": None}}
    assert [s.total for s in registry.lag_samples("standardize", 1, limit=2)] == [None, 0]
    assert [s.total for s in registry.lag_samples("standardize", 1, since=1001.0)] == [None, 0]
    assert registry.lag_samples("standardize", 2) == []


def test_lag_sample_of_an_unknown_version(registry):
    allocate(registry)
    with pytest.raises(NotFoundError, match=r"pipeline 'standardize' has no version v5 \(versions: v1\)"):
        registry.add_lag_sample("standardize", 5, 1, {})
    with pytest.raises(RegistryError, match=r"lag total must be an integer or None \(unknown\), got '3'"):
        registry.add_lag_sample("standardize", 1, "3", {})
    assert registry.lag_samples("standardize", 1) == []


def test_audit_log_records_who_what_why_and_outcome(registry):
    allocate(registry)
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    entry = registry.audit("promote", actor="alice", pipeline="standardize", version=1, reason="new titles",
                           outcome="refused", details={"lag": 12, "at": when, "partitions": {"0": 12}})
    assert (entry.action, entry.actor, entry.pipeline, entry.version, entry.reason, entry.outcome) == (
        "promote", "alice", "standardize", 1, "new titles", "refused")
    assert entry.details == {"lag": 12, "at": str(when), "partitions": {"0": 12}}
    registry.audit("demo", actor="bob")
    everything = registry.audit_log(limit=None)
    assert [e.action for e in everything] == ["allocate_version", "promote", "demo"]
    assert [e.action for e in registry.audit_log("standardize")] == ["allocate_version", "promote"]
    assert [e.action for e in registry.audit_log(limit=2)] == ["promote", "demo"]
    assert [e.action for e in registry.audit_log(version=1, action="promote")] == ["promote"]
    assert everything[-1].details == {} and everything[-1].pipeline is None
    assert everything[0].at <= everything[1].at <= everything[2].at


def test_audit_needs_actor_action_and_json_details(registry):
    with pytest.raises(RegistryError, match="every registry change needs an actor"):
        registry.audit("deploy", actor="")
    with pytest.raises(RegistryError, match="an audit entry needs an action"):
        registry.audit(" ", actor="alice")
    with pytest.raises(RegistryError, match="audit details must be JSON-serializable"):
        registry.audit("deploy", actor="alice", details={(1, 2): "tuple keys are not JSON"})
    assert registry.audit_log() == []
