"""Helpers shared by the registry integration tests (a unique module name: no package here)."""

from __future__ import annotations

from datetime import datetime, timezone

from orchestrator.registry import Registry


def iso(ts: float) -> str:
    """How registry messages print a time."""
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def allocate(reg: Registry, pipeline: str = "standardize", *, actor: str = "alice", reason: str = "test",
             queue: bool = False, rules_version: str = "v1"):
    return reg.allocate_version(
        pipeline, rules_version=rules_version, rules_hash=f"hash-{rules_version}", code_ref="git:abc123",
        table_path=f"/wh/{pipeline}/v{{n}}", checkpoint_path=f"/state/{pipeline}/v{{n}}/checkpoint",
        group_id=f"kappa.{pipeline}.v{{n}}", actor=actor, reason=reason, queue=queue)
