"""Versioned schema migrations (Alembic): a registry created by an older kappa keeps working, also one
made before kappa used Alembic, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from registry_helpers import allocate

from orchestrator.core.exceptions import ConflictError, RegistryError
from orchestrator.registry import HEAD, MIGRATIONS, Registry, metadata
from orchestrator.registry.migrations import revision_of
from orchestrator.registry.schema import alembic_revision, apply_step, schema_migrations

pytestmark = pytest.mark.integration


def old_registry_with_data(url: str) -> None:
    """What kappa at schema step 1 left behind: v1 served then replaced by v2, v3 backfilling."""
    old = Registry(url, auto_migrate=False)
    try:
        assert old.migrate(target=1) == [1]
        assert old.schema_version() == 1
        with old._engine.begin() as c:
            c.execute(sa.text("INSERT INTO pipelines (name, last_version, created_at) VALUES ('standardize', 3, 100)"))
            for n, state in ((1, "standby"), (2, "serving"), (3, "backfilling")):
                c.execute(sa.text(
                    "INSERT INTO versions (pipeline, version, state, rules_version, rules_hash, code_ref, table_path, "
                    "checkpoint_path, group_id, actor, reason, created_at, updated_at) VALUES ('standardize', :n, "
                    ":s, 'v1', 'h', 'git:old', '/wh/v' || :t, '/st/v' || :t, 'kappa.standardize.v' || :t, 'alice', "
                    "'old', 100 + :n, 200 + :n)"), {"n": n, "s": state, "t": str(n)})
            c.execute(sa.text(
                "INSERT INTO aliases (alias, pipeline, version, previous_version, updated_at, updated_by, reason) "
                "VALUES ('member_profiles_std', 'standardize', 2, 1, 150, 'alice', 'v2 rules')"))
            c.execute(sa.text(
                "INSERT INTO alias_history (alias, pipeline, from_version, to_version, actor, reason, at) VALUES "
                "('member_profiles_std', 'standardize', NULL, 1, 'alice', 'first', 120), "
                "('member_profiles_std', 'standardize', 1, 2, 'alice', 'v2 rules', 150)"))
            c.execute(sa.text(
                "INSERT INTO audit_log (at, actor, action, pipeline, version, reason, outcome, details) VALUES "
                "(150, 'alice', 'promote', 'standardize', 2, 'v2 rules', 'ok', '{\"lag\": 0}')"))
    finally:
        old.close()


def test_older_registry_is_migrated_and_keeps_working(registry_url):
    old_registry_with_data(registry_url)
    reg = Registry(registry_url)  # migrates on open
    try:
        assert reg.schema_version() == HEAD
        v1, v2, v3 = reg.list_versions("standardize")
        # served_at back-filled from the alias history; v3 never served: still in flight
        assert (v1.served_at, v2.served_at, v3.served_at) == (120.0, 150.0, None)
        assert (v1.details, v3.rejects_path, v3.table_path) == ({}, None, "/wh/v3")
        assert reg.in_flight("standardize").version == 3
        with pytest.raises(ConflictError, match=r"already has v3 in flight \(state backfilling"):
            allocate(reg)
        alias = reg.get_alias("member_profiles_std")
        assert (alias.version, alias.previous_version, alias.published_version) == (2, 1, None)
        assert alias.needs_publish  # unknown after the upgrade: reconcile republishes
        assert [h.to_version for h in reg.alias_history("member_profiles_std")] == [1, 2]
        assert reg.audit_log("standardize")[0].details == {"lag": 0}
        # everything new works on the old data
        assert allocate(reg, queue=True).version == 4
        reg.add_lag_sample("standardize", 3, 5, {"member_profiles": {"0": 5}})
        assert [s.total for s in reg.lag_samples("standardize", 3)] == [5]
        reg.set_state("standardize", 3, "caught_up", expected="backfilling")
        assert reg.flip_alias("member_profiles_std", "standardize", expected_version=2, new_version=3,
                              actor="bob", reason="v3").version == 3
        assert reg.mark_published("member_profiles_std", 3).published_version == 3
        assert reg.migrate() == []
    finally:
        reg.close()


def test_migrations_build_exactly_the_head_schema(registry_url):
    reg = Registry(registry_url)
    try:
        insp = sa.inspect(reg._engine)
        assert set(insp.get_table_names()) == set(metadata.tables) | {"alembic_version"}
        for name, table in metadata.tables.items():
            assert sorted(c["name"] for c in insp.get_columns(name)) == sorted(table.columns.keys()), name
            assert sorted(i["name"] for i in insp.get_indexes(name)) == sorted(i.name for i in table.indexes), name
        with reg._engine.connect() as c:
            rows = c.execute(sa.text("SELECT version, name FROM schema_migrations ORDER BY version")).all()
            revision = alembic_revision(c)
        assert [tuple(r) for r in rows] == [(m.version, m.name) for m in MIGRATIONS]
        assert revision == revision_of(HEAD)
    finally:
        reg.close()


def pre_alembic_registry(url: str, steps: int) -> None:
    """A registry as kappa made it before it used Alembic: the steps applied one by one and recorded
    in schema_migrations, no alembic_version table; one version and one lag sample."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as c:
            schema_migrations.create(c)
            for step in range(1, steps + 1):
                apply_step(c, step)
        with engine.begin() as c:
            assert not sa.inspect(c).has_table("alembic_version")
            c.execute(sa.text("INSERT INTO pipelines (name, last_version, created_at) VALUES ('standardize', 1, 100)"))
            c.execute(sa.text(
                "INSERT INTO versions (pipeline, version, state, rules_version, rules_hash, code_ref, table_path, "
                "checkpoint_path, group_id, actor, reason, created_at, updated_at) VALUES ('standardize', 1, "
                "'created', 'v1', 'h', 'git:old', '/wh/v1', '/st/v1', 'kappa.standardize.v1', 'alice', 'old', 101, 201)"))
            c.execute(sa.text("INSERT INTO lag_samples (pipeline, version, at, total, partitions) VALUES "
                              "('standardize', 1, 100, 7, '{}')"))
    finally:
        engine.dispose()


@pytest.mark.parametrize("steps", [2, HEAD])
def test_a_registry_made_before_alembic_is_upgraded_in_place(registry_url, steps):
    pre_alembic_registry(registry_url, steps)
    reg = Registry(registry_url)  # stamped at its step, then upgraded
    try:
        assert reg.schema_version() == HEAD
        with reg._engine.connect() as c:
            assert alembic_revision(c) == revision_of(HEAD)
            applied = [r[0] for r in c.execute(sa.text("SELECT version FROM schema_migrations ORDER BY version"))]
        assert applied == list(range(1, HEAD + 1))              # each step once
        (sample,) = reg.lag_samples("standardize", 1)
        assert (sample.total, sample.lag_seconds) == (7, None)  # kept, and the new column is there
        assert reg.get_version("standardize", 1).state == "created"
        assert reg.migrate() == []
    finally:
        reg.close()


def test_newer_registry_is_refused(registry_url):
    reg = Registry(registry_url)
    with reg._engine.begin() as c:
        c.execute(sa.text("INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'future', 0)"))
    reg.close()
    with pytest.raises(RegistryError) as e:
        Registry(registry_url)
    assert str(e.value) == (
        f"registry {reg.url} has schema version 99, newer than this kappa knows ({HEAD}): upgrade kappa, or point "
        f"KAPPA_REGISTRY_URL at another registry")


def test_unknown_target(registry_url):
    reg = Registry(registry_url, auto_migrate=False)
    try:
        with pytest.raises(RegistryError, match=rf"no schema version {HEAD + 1}: this kappa knows 1 to {HEAD}"):
            reg.migrate(HEAD + 1)
        assert reg.schema_version() == 0
    finally:
        reg.close()


def test_migrating_logs_nothing_from_alembic(registry_url, caplog):
    """Alembic's INFO chatter (its dialect choice, each revision) stays out of kappa's CLI output and task logs."""
    pre_alembic_registry(registry_url, 2)
    with caplog.at_level("DEBUG"):
        reg = Registry(registry_url)  # stamps, then upgrades: Alembic runs
        reg.close()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("alembic")] == []
    reopened = Registry(registry_url)
    try:
        assert reopened.schema_version() == HEAD
    finally:
        reopened.close()
