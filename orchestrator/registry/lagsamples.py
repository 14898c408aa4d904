"""Lag samples with their lag in seconds, and the registry figures the metrics endpoint reads.

`LagSampleOps` (mixed into `Registry`) stores, lists and prunes samples. Functions over a
`Registry` (they use its transactions): `add_lag_sample` stores a reading with
its `lag_seconds` (schema step 4) and the micro-batches its job had committed since it started
(`batches`, step 5) in one insert; `latest_lag_samples` is the newest sample of every
version (the "now" of the lag gauges); `audit_counts` counts audit entries by action, outcome and
pipeline (flips and job restarts are audit entries, so their counts survive any process).
"""

from __future__ import annotations

import math
import time
from typing import Any, Iterable

import sqlalchemy as sa

from orchestrator.core.crashpoints import faultpoint
from orchestrator.core.exceptions import RegistryError
from orchestrator.registry.records import LagSampleRecord
from orchestrator.registry.schema import audit_log, lag_samples_table, versions
from orchestrator.registry.values import plain_json, unix_seconds

__all__ = ["LagSampleOps", "add_lag_sample", "audit_counts", "latest_lag_samples"]


class LagSampleOps:
    """Mixed into `Registry` (which provides `_tx` and `_missing_version`)."""

    def add_lag_sample(self, pipeline: str, n: int, total: int | None, partitions: dict[str, Any],
                       at: Any = None, lag_seconds: float | None = None, batches: int | None = None
                       ) -> LagSampleRecord:
        """Store one lag reading; `total`, `lag_seconds` and `batches` None mean unknown (never zero)."""
        return add_lag_sample(self, pipeline, n, total, partitions, at=at, lag_seconds=lag_seconds, batches=batches)

    def lag_samples(self, pipeline: str, n: int, limit: int | None = None, since: Any = None
                    ) -> list[LagSampleRecord]:
        """The most recent `limit` samples (all if None) at or after `since`, oldest first."""
        t = lag_samples_table
        q = sa.select(t).where(t.c.pipeline == pipeline, t.c.version == n)
        if since is not None:
            q = q.where(t.c.at >= unix_seconds(since, "since"))
        q = q.order_by(t.c.at.desc(), t.c.id.desc())
        if limit is not None:
            q = q.limit(limit)
        with self._tx(f"reading lag samples of {pipeline} v{n}", write=False) as conn:
            rows = conn.execute(q).all()
        return [LagSampleRecord.from_row(r) for r in reversed(rows)]

    def prune_lag_samples(self, older_than: Any) -> int:
        """Delete every lag sample taken before `older_than` (all pipelines); the number deleted."""
        cutoff = unix_seconds(older_than, "older_than")
        with self._tx("pruning old lag samples", write=True) as conn:
            return conn.execute(lag_samples_table.delete().where(lag_samples_table.c.at < cutoff)).rowcount or 0


def add_lag_sample(reg: Any, pipeline: str, n: int, total: int | None, partitions: dict[str, Any], *,
                   at: Any = None, lag_seconds: float | None = None, batches: int | None = None) -> LagSampleRecord:
    """Store one lag reading; `total`, `lag_seconds` and `batches` None mean unknown (never zero).

    `batches`: the micro-batches the version's job had committed since it started when the reading
    was taken (its status's count)."""
    if total is not None and (isinstance(total, bool) or not isinstance(total, int)):
        raise RegistryError(f"lag total must be an integer or None (unknown), got {total!r}")
    if lag_seconds is not None:
        if isinstance(lag_seconds, bool) or not isinstance(lag_seconds, (int, float)) \
                or not math.isfinite(lag_seconds) or lag_seconds < 0:
            raise RegistryError(f"lag in seconds must be a finite number >= 0 or None (unknown), got {lag_seconds!r}")
        lag_seconds = float(lag_seconds)
    if batches is not None and (isinstance(batches, bool) or not isinstance(batches, int) or batches < 0):
        raise RegistryError(f"batches of a lag sample must be an integer >= 0 or None (unknown), got {batches!r}")
    at_ts = time.time() if at is None else unix_seconds(at, "at")
    parts = plain_json(partitions or {}, "lag partitions")
    with reg._tx(f"recording a lag sample of {pipeline} v{n}", write=True) as conn:
        exists = conn.execute(sa.select(versions.c.version).where(
            versions.c.pipeline == pipeline, versions.c.version == n)).first()
        if exists is None:
            raise reg._missing_version(conn, pipeline, n)
        # each only when known: a registry not yet at step 4 or 5 (auto_migrate=False) takes the rest
        known = {name: value for name, value in (("lag_seconds", lag_seconds), ("batches", batches))
                 if value is not None}
        sample_id = conn.execute(lag_samples_table.insert().values(
            pipeline=pipeline, version=n, at=at_ts, total=total, partitions=parts, **known)).inserted_primary_key[0]
        faultpoint("lag_sample.inserted")   # a fault test loses the database here: before the commit
    return LagSampleRecord(id=sample_id, pipeline=pipeline, version=n, at=at_ts, total=total, partitions=parts,
                           lag_seconds=lag_seconds, batches=batches)


def latest_lag_samples(reg: Any, pipelines: Iterable[str] | None = None) -> dict[tuple[str, int], LagSampleRecord]:
    """{(pipeline, version): its newest lag sample} (newest by registry id, as readiness orders them)."""
    t = lag_samples_table
    newest = sa.select(sa.func.max(t.c.id).label("id")).group_by(t.c.pipeline, t.c.version)
    if pipelines is not None:
        newest = newest.where(t.c.pipeline.in_(list(pipelines)))
    q = sa.select(t).where(t.c.id.in_(newest.scalar_subquery())).order_by(t.c.pipeline, t.c.version)
    with reg._tx("reading the newest lag samples", write=False) as conn:
        rows = conn.execute(q).all()
    return {(r.pipeline, r.version): LagSampleRecord.from_row(r) for r in rows}


def audit_counts(reg: Any, actions: Iterable[str]) -> dict[tuple[str, str, str | None], int]:
    """{(action, outcome, pipeline): number of audit entries} for the given actions."""
    a = audit_log
    q = (sa.select(a.c.action, a.c.outcome, a.c.pipeline, sa.func.count().label("n"))
         .where(a.c.action.in_(list(actions))).group_by(a.c.action, a.c.outcome, a.c.pipeline))
    with reg._tx("counting audit entries", write=False) as conn:
        return {(r.action, r.outcome, r.pipeline): int(r.n) for r in conn.execute(q).all()}
