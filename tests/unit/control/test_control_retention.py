"""Retention and retire: protected versions, dry run, what gets deleted."""

from __future__ import annotations

from pathlib import Path
import pytest

from control_helpers import ALIAS, PIPELINE, allocate, profiles, write_table
from orchestrator.lifecycle import retire as retention
from orchestrator.core.exceptions import LifecycleError
from orchestrator.lifecycle.retire import apply_retention, retire


@pytest.fixture
def groups(monkeypatch):
    deleted = []
    monkeypatch.setattr(retention, "_delete_group", lambda k, g: deleted.append(g) or "deleted")
    return deleted


def _with_files(k, v):
    p = k.paths(PIPELINE, v)
    write_table(p.table, profiles([("m1", "a", "A", "n", 1)]))
    write_table(p.rejects, profiles([("m1", "a", "A", "n", 1)]))
    (Path(p.checkpoint) / "offsets").mkdir(parents=True)
    (Path(p.checkpoint) / "offsets" / "0").write_text("{}")
    p.run_dir.mkdir(parents=True)
    (p.run_dir / "job.log").write_text("log")
    return p


def _serve(k, v, prev=None):
    k.registry.flip_alias(ALIAS, PIPELINE, expected_version=prev, new_version=v, actor="t", reason="r")


def test_retire_refuses_the_serving_version_and_the_rollback_target(k, groups):
    v1, v2 = allocate(k).version, allocate(k).version
    _serve(k, v1)
    _serve(k, v2, v1)
    with pytest.raises(LifecycleError) as e:
        retire(k.version(PIPELINE, v2), actor="alice", reason="cleanup")
    assert str(e.value) == (f"cannot retire {PIPELINE} v{v2}: it serves alias '{ALIAS}'; promote or roll back to "
                            f"another version first")
    with pytest.raises(LifecycleError) as e:
        retire(k.version(PIPELINE, v1), actor="alice", reason="cleanup", dry_run=True)
    assert str(e.value) == (f"cannot retire {PIPELINE} v{v1}: it is the rollback target of alias '{ALIAS}'; "
                            f"promote or roll back to another version first")
    assert [a.outcome for a in k.registry.audit_log(PIPELINE, action="retire")] == ["refused"]
    assert groups == []


def test_retire_dry_run_then_for_real(k, groups):
    v1, v2, v3 = (allocate(k).version for _ in range(3))
    _serve(k, v2)
    _serve(k, v3, v2)
    p = _with_files(k, v1)
    plan = retire(k.version(PIPELINE, v1), actor="alice", reason="old", dry_run=True)
    assert plan.dry_run and plan.actions[0] == f"stop the job of v{v1} (if running)"
    assert any(a.startswith(f"delete table {p.table} (") for a in plan.actions)
    assert plan.actions[-2:] == [f"delete consumer group kappa.{PIPELINE}.v{v1}", f"set {PIPELINE} v{v1} to retired"]
    assert Path(p.table).exists() and k.registry.get_version(PIPELINE, v1).state == "created"
    res = retire(k.version(PIPELINE, v1), actor="alice", reason="old")
    assert not Path(p.table).exists() and not Path(p.rejects).exists() and not p.version_dir.exists()
    assert groups == [f"kappa.{PIPELINE}.v{v1}"] and res.bytes_freed > 0
    assert k.registry.get_version(PIPELINE, v1).state == "retired"
    again = retire(k.version(PIPELINE, v1), actor="alice", reason="old")  # idempotent
    assert again.bytes_freed == 0


def test_apply_retention_keeps_the_last_k_and_never_the_protected(k, groups):
    vs = [allocate(k).version for _ in range(5)]
    _serve(k, vs[0])
    _serve(k, vs[4], vs[0])  # serving v5, rollback target v1
    for v in vs[1:4]:
        k.registry.set_state(PIPELINE, v, "stopped")  # ran and stopped: no longer in flight
    plan = apply_retention(k, k.pipeline(PIPELINE), actor="cron", keep=2)
    assert plan.dry_run and plan.kept == [vs[3], vs[4]]
    assert plan.retire == [vs[1], vs[2]] and list(plan.protected) == [vs[0]]
    states = [k.registry.get_version(PIPELINE, v).state for v in vs]
    done = apply_retention(k, k.pipeline(PIPELINE), actor="cron", keep=2, dry_run=False)
    assert [k.registry.get_version(PIPELINE, v).state for v in vs] == \
        [states[0], "retired", "retired", "stopped", states[4]]
    assert done.message == f"{PIPELINE}: keep {[vs[3], vs[4]]}; retired {[vs[1], vs[2]]}; protected {[vs[0]]}"


def test_retention_does_not_count_versions_in_flight_among_those_it_keeps(k, groups):
    """Issue 9 case 13: a reprocess in flight pushed a finished version out under it."""
    vs = [allocate(k).version for _ in range(4)]
    _serve(k, vs[0])
    _serve(k, vs[1], vs[0])           # v2 serves, v1 is its rollback target
    k.registry.set_state(PIPELINE, vs[2], "stopped")
    k.registry.set_state(PIPELINE, vs[3], "backfilling")   # a reprocess in flight
    plan = apply_retention(k, k.pipeline(PIPELINE), actor="cron", keep=2, dry_run=False)
    assert plan.kept == [vs[1], vs[2]] and plan.retire == []
    assert sorted(plan.protected) == [vs[0], vs[3]]
    assert plan.protected[vs[3]] == "it is in flight (backfilling): deployed and not yet served"
    assert [k.registry.get_version(PIPELINE, v).state for v in vs][2:] == ["stopped", "backfilling"]
