"""Alias compare-and-swap, history, publish tracking, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from registry_helpers import allocate, iso

from orchestrator.core.exceptions import ConfigError, ConflictError, NotFoundError

pytestmark = pytest.mark.integration

ALIAS = "member_profiles_std"


def served_by_v1(registry):
    allocate(registry)
    allocate(registry, queue=True, rules_version="v2")
    return registry.flip_alias(ALIAS, "standardize", expected_version=None, new_version=1, actor="alice",
                               reason="first promote")


def test_create_then_flip(registry):
    created = served_by_v1(registry)
    assert (created.alias, created.pipeline, created.version, created.previous_version, created.updated_by,
            created.reason, created.published_version) == (ALIAS, "standardize", 1, None, "alice",
                                                           "first promote", None)
    assert created.needs_publish
    assert registry.get_version("standardize", 1).served_at is not None
    assert registry.get_version("standardize", 2).in_flight

    flipped = registry.flip_alias(ALIAS, "standardize", expected_version=1, new_version=2, actor="bob",
                                  reason="v2 rules")
    assert (flipped.version, flipped.previous_version, flipped.updated_by, flipped.reason) == (2, 1, "bob", "v2 rules")
    assert registry.get_alias(ALIAS) == flipped
    assert not registry.get_version("standardize", 2).in_flight
    history = registry.alias_history(ALIAS)
    assert [(h.from_version, h.to_version, h.actor, h.reason) for h in history] == [
        (None, 1, "alice", "first promote"), (1, 2, "bob", "v2 rules")]
    assert registry.alias_history(ALIAS, limit=1) == history[-1:]
    assert [a.alias for a in registry.list_aliases()] == [ALIAS]
    assert registry.get_alias("nothing") is None


def test_flip_from_a_stale_version_is_refused_and_changes_nothing(registry):
    current = served_by_v1(registry)
    with pytest.raises(ConflictError) as e:
        registry.flip_alias(ALIAS, "standardize", expected_version=2, new_version=1, actor="carol",
                            reason="rollback")
    assert str(e.value) == (
        f"alias 'member_profiles_std' points at v1 now, not v2 as this flip expected: it was moved by alice at "
        f"{iso(current.updated_at)} (reason: 'first promote'). Nothing was changed. Re-read the alias "
        f"(kappa status) and retry if the move still makes sense")
    assert registry.get_alias(ALIAS) == current
    assert len(registry.alias_history(ALIAS)) == 1
    last = registry.audit_log(action="flip_alias")[-1]
    assert (last.actor, last.outcome, last.details["error"]) == ("carol", "conflict", str(e.value))


def test_creating_an_existing_alias_is_a_conflict(registry):
    current = served_by_v1(registry)
    with pytest.raises(ConflictError) as e:
        registry.flip_alias(ALIAS, "standardize", expected_version=None, new_version=2, actor="bob", reason="r")
    assert str(e.value) == (
        f"alias 'member_profiles_std' already exists and points at v1 (set by alice at {iso(current.updated_at)} "
        f"(reason: 'first promote')); this flip expected to create it. Nothing was changed. Re-read the alias "
        f"(kappa status) and retry if the move still makes sense")


def test_flip_of_a_missing_alias_with_an_expected_version(registry):
    allocate(registry)
    with pytest.raises(ConflictError) as e:
        registry.flip_alias(ALIAS, "standardize", expected_version=1, new_version=1, actor="a", reason=None)
    assert str(e.value) == ("alias 'member_profiles_std' does not exist (it was expected at v1); nothing was "
                            "changed. Re-read it (kappa status) and retry")
    assert registry.get_alias(ALIAS) is None


def test_flip_to_the_current_version_is_a_logged_noop(registry):
    current = served_by_v1(registry)
    again = registry.flip_alias(ALIAS, "standardize", expected_version=1, new_version=1, actor="bob", reason="retry")
    assert again == current
    assert len(registry.alias_history(ALIAS)) == 1
    assert registry.audit_log(action="flip_alias")[-1].outcome == "noop"


def test_flip_refusals(registry):
    served_by_v1(registry)
    allocate(registry, "pageviews_hourly")
    with pytest.raises(NotFoundError, match=r"pipeline 'standardize' has no version v9 \(versions: v1, v2\)"):
        registry.flip_alias(ALIAS, "standardize", expected_version=1, new_version=9, actor="a", reason=None)
    with pytest.raises(ConflictError) as e:
        registry.flip_alias(ALIAS, "pageviews_hourly", expected_version=1, new_version=1, actor="a", reason=None)
    assert str(e.value) == ("alias 'member_profiles_std' belongs to pipeline 'standardize', not "
                            "'pageviews_hourly'; pick the alias declared for 'pageviews_hourly'")
    registry.set_state("standardize", 2, "retired")
    with pytest.raises(ConflictError) as e:
        registry.flip_alias(ALIAS, "standardize", expected_version=1, new_version=2, actor="a", reason=None)
    assert str(e.value) == ("standardize v2 is retired (its table may be deleted); alias 'member_profiles_std' "
                            "cannot point at it. Deploy a new version instead")
    with pytest.raises(ConfigError, match=r"invalid alias name '\.\./x'"):
        registry.flip_alias("../x", "standardize", expected_version=1, new_version=2, actor="a", reason=None)
    assert registry.get_alias(ALIAS).version == 1
    assert len(registry.alias_history(ALIAS)) == 1


def test_publish_tracking(registry):
    served_by_v1(registry)
    published = registry.mark_published(ALIAS, 1)
    assert (published.published_version, published.needs_publish) == (1, False)
    assert published.published_at is not None
    flipped = registry.flip_alias(ALIAS, "standardize", expected_version=1, new_version=2, actor="a", reason=None)
    # CAS done, pointer not yet written: what reconcile looks for
    assert (flipped.version, flipped.published_version, flipped.needs_publish) == (2, 1, True)
    assert not registry.mark_published(ALIAS, 2).needs_publish
    with pytest.raises(NotFoundError, match="no alias 'nothing' in the registry"):
        registry.mark_published("nothing", 1)


def test_the_served_version_cannot_be_retired(registry):
    served_by_v1(registry)
    with pytest.raises(ConflictError) as e:
        registry.set_state("standardize", 1, "retired")
    assert str(e.value) == ("standardize v1 is served by alias 'member_profiles_std'; it cannot be retired. Flip "
                            "the alias to another version first (kappa promote / kappa rollback)")
    assert registry.get_version("standardize", 1).state == "created"
    registry.flip_alias(ALIAS, "standardize", expected_version=1, new_version=2, actor="a", reason=None)
    assert registry.set_state("standardize", 1, "retired").state == "retired"
