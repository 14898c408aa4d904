"""Version allocation, the in-flight refusal and state changes, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from registry_helpers import allocate, iso

from orchestrator.core.paths import version_paths
from orchestrator.core.settings import Settings
from orchestrator.core.exceptions import ConflictError, NotFoundError, RegistryError

pytestmark = pytest.mark.integration


def test_numbers_start_at_one_and_count_up_per_pipeline(registry):
    v1 = allocate(registry)
    v2 = allocate(registry, queue=True)
    other = allocate(registry, "pageviews_hourly")
    v3 = allocate(registry, queue=True, rules_version="v2")
    assert [v1.version, v2.version, v3.version, other.version] == [1, 2, 3, 1]
    assert [v.version for v in registry.list_versions("standardize")] == [1, 2, 3]
    assert v3.table_path == "/wh/standardize/v3"
    assert v3.checkpoint_path == "/state/standardize/v3/checkpoint"
    assert v3.group_id == "kappa.standardize.v3"
    assert (v3.state, v3.rules_version, v3.rules_hash, v3.code_ref, v3.actor, v3.reason) == (
        "created", "v2", "hash-v2", "git:abc123", "alice", "test")
    assert v3.in_flight and not v3.ever_served
    assert registry.get_version("standardize", 3) == v3
    assert [(p.name, p.last_version) for p in registry.list_pipelines()] == [
        ("pageviews_hourly", 1), ("standardize", 3)]


def test_paths_callable_fills_every_path(registry, tmp_path):
    settings = Settings(home=tmp_path)
    v = registry.allocate_version(
        "standardize", rules_version="v1", rules_hash="h", code_ref=None, actor="alice", reason="r",
        paths=lambda n: version_paths(settings, "standardize", n), details={"threshold": 0})
    p = version_paths(settings, "standardize", 1)
    assert (v.table_path, v.checkpoint_path, v.group_id, v.run_dir, v.rejects_path) == (
        str(p.table), str(p.checkpoint), p.group_id, str(p.run_dir), str(p.rejects))
    assert v.details == {"threshold": 0}


def test_second_deploy_is_refused_naming_the_one_in_flight(registry):
    v1 = allocate(registry, reason="new titles")
    registry.set_state("standardize", 1, "backfilling")
    with pytest.raises(ConflictError) as e:
        allocate(registry, actor="bob", reason="again")
    assert str(e.value) == (
        f"pipeline 'standardize' already has v1 in flight (state backfilling, deployed by alice at "
        f"{iso(v1.created_at)} (reason: 'new titles')); refusing a second reprocess. Promote or stop v1 first "
        f"(kappa stop standardize 1), or queue this one (--queue)")
    assert e.value.in_flight_version == 1
    # the refusal changed nothing, and is in the audit log
    assert [v.version for v in registry.list_versions("standardize")] == [1]
    assert registry.list_pipelines()[0].last_version == 1
    last = registry.audit_log("standardize")[-1]
    assert (last.action, last.actor, last.outcome, last.version, last.reason) == (
        "allocate_version", "bob", "conflict", None, "again")
    assert last.details["error"] == str(e.value)
    assert registry.in_flight("standardize").version == 1


@pytest.mark.parametrize("end_state", ["stopped", "failed", "retired", "serving", "standby"])
def test_a_version_stops_being_in_flight(registry, end_state):
    allocate(registry)
    registry.set_state("standardize", 1, end_state)
    assert registry.in_flight("standardize") is None
    assert allocate(registry).version == 2


def test_a_version_that_served_is_not_in_flight_when_restarted(registry):
    allocate(registry)
    registry.flip_alias("member_profiles_std", "standardize", expected_version=None, new_version=1,
                        actor="alice", reason="first")
    registry.set_state("standardize", 1, "starting")  # e.g. a rollback restarting it from its checkpoint
    assert registry.in_flight("standardize") is None
    assert allocate(registry).version == 2


def test_set_state_compare_and_swap(registry):
    allocate(registry)
    v = registry.set_state("standardize", 1, "starting", expected="created", pid=4242, run_dir="/state/run")
    assert (v.state, v.pid, v.run_dir) == ("starting", 4242, "/state/run")
    assert v.started_at is not None and v.stopped_at is None
    v = registry.set_state("standardize", 1, "backfilling", expected=("starting", "created"))
    assert v.state == "backfilling" and v.pid == 4242
    with pytest.raises(ConflictError) as e:
        registry.set_state("standardize", 1, "stopped", expected="caught_up")
    assert str(e.value) == (
        "standardize v1 is backfilling, not caught_up as expected: another operation changed it since it was "
        "read; nothing was changed. Re-read it (kappa status standardize) and retry if the move still makes sense")
    assert registry.get_version("standardize", 1).state == "backfilling"


def test_set_state_timestamps(registry):
    allocate(registry)
    first = registry.set_state("standardize", 1, "caught_up").caught_up_at
    assert first is not None
    registry.set_state("standardize", 1, "backfilling")
    assert registry.set_state("standardize", 1, "caught_up").caught_up_at == first
    served = registry.set_state("standardize", 1, "serving").served_at
    assert served is not None
    v = registry.set_state("standardize", 1, "failed", error="boom")
    assert (v.error, v.served_at) == ("boom", served)
    assert v.stopped_at is not None
    v = registry.set_state("standardize", 1, "starting", error=None, started_at=123.5)
    assert (v.error, v.started_at) == (None, 123.5)


def test_set_state_refuses_unknown_state_and_field(registry):
    allocate(registry)
    with pytest.raises(RegistryError) as e:
        registry.set_state("standardize", 1, "running")
    assert str(e.value) == ("unknown version state 'running'; states are created, starting, backfilling, "
                            "caught_up, serving, standby, stopped, failed, retiring, retired")
    with pytest.raises(RegistryError) as e:
        registry.set_state("standardize", 1, "stopped", table_path="/elsewhere")
    assert str(e.value) == ("set_state cannot change table_path; it sets pid, run_dir, rejects_path, error, "
                            "started_at, stopped_at, caught_up_at, details")
    assert registry.get_version("standardize", 1).state == "created"


def test_not_found_messages(registry):
    with pytest.raises(NotFoundError) as e:
        registry.get_version("standardize", 1)
    assert str(e.value) == (f"pipeline 'standardize' has no versions in the registry {registry.url}; "
                            f"deploy one first (kappa deploy standardize)")
    allocate(registry)
    allocate(registry, queue=True)
    with pytest.raises(NotFoundError) as e:
        registry.set_state("standardize", 7, "stopped")
    assert str(e.value) == ("pipeline 'standardize' has no version v7 (versions: v1, v2); "
                            "see kappa status standardize")
    assert registry.list_versions("nothing") == []


def test_allocate_validates_its_input(registry):
    with pytest.raises(Exception, match=r"invalid pipeline name 'Bad Name'"):
        allocate(registry, "Bad Name")
    with pytest.raises(RegistryError, match="every registry change needs an actor"):
        allocate(registry, actor=" ")
    assert registry.list_pipelines() == []


def test_list_versions_by_state(registry):
    for _ in range(3):
        allocate(registry, queue=True)
    registry.set_state("standardize", 2, "failed", error="boom")
    assert [v.version for v in registry.list_versions("standardize", states=["created"])] == [1, 3]
    assert [v.version for v in registry.list_versions("standardize", states="failed")] == [2]
    with pytest.raises(RegistryError, match="unknown version state 'running'"):
        registry.list_versions("standardize", states=["running"])
