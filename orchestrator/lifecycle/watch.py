"""The watch: a promoted version that degrades in its grace period is rolled back by itself.

A promote of a pipeline with `auto_rollback` stores a watch with its flip (in the registry,
`Registry.update_watch`, `end_watch_in_flip`), so it outlives the process that promoted. Every monitor pass
(`kappa supervise` on the embedded stack, Airflow's `kappa_monitor`) runs `watch_pass` first. While
the previous version is standby and the grace period lasts, a pass samples the promoted version:

- its job: given up by supervision since the promote (a restart bound reached, or a deterministic
  failure), or the version failed;
- its lag in seconds: over `watch_max_lag_seconds` (default `catchup_seconds`) for
  `watch_lag_samples` consecutive samples;
- its reject rate: over `max_reject_rate`;
- the pipeline's checks with `watch = true`, re-run on the live tables (the promoted version as
  `candidate`, the standby as `serving`).

On a failure the pass decides (the watch moves to `rolling_back`, audited with the failing figure,
in one transaction), then rolls back with the rollback verb (actor `kappa-watch`), whose flip sets
the watch `rolled_back` in its own transaction; then the degraded version is stopped or kept
running (`watch_on_rollback`). A pass killed between the decision and the flip finishes the
rollback on the next pass; killed after the flip, the next pass publishes and settles it. At most
one automatic rollback per promote; `promote` refuses a version rolled back automatically unless
forced. A manual promote or rollback during the watch ends it (in that flip's transaction). At the
end of the grace period the watch `passed`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from orchestrator.core.checks import run_checks
from orchestrator.core.crashpoints import crashpoint
from orchestrator.core.exceptions import ConflictError, KappaError
from orchestrator.context import Kappa, VersionRef
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.core.states import VersionState

__all__ = ["ACTOR", "watch_pass", "watch_of", "describe_watch"]

log = logging.getLogger(__name__)

#: Who rolls back: the audit log's actor of every automatic rollback.
ACTOR = "kappa-watch"
#: How long an automatic rollback waits for the standby to be ready (it runs, so at once; a standby
#: whose job died is restarted from its checkpoint). Past it, the pass reports the failed rollback
#: and the next pass tries again: one pass never blocks a monitor for long.
ROLLBACK_DEADLINE_SECONDS = 90.0


def watch_of(rec: Any) -> dict[str, Any] | None:
    w = (rec.details or {}).get("watch")
    return w if isinstance(w, dict) else None


def describe_watch(version: int, w: dict[str, Any], now: float | None = None) -> str:
    """One line for `kappa status`: the watch's state, its samples and its decision."""
    now = time.time() if now is None else now
    state = w.get("state")
    base = f"watch of v{version} (standby v{w.get('standby')}): {state}, {w.get('samples', 0)} samples"
    if state == "watching":
        left = max(0.0, float(w.get("until", now)) - now)
        last = w.get("last") or {}
        lag = last.get("lag_seconds")
        return (base + f", {left:.0f} s left; lag {'unknown' if lag is None else f'{lag:.1f} s'}, "
                f"{w.get('lag_over', 0)} sample(s) over the limit in a row")
    if state in ("rolling_back", "rolled_back"):
        return base + f"; rolled back automatically: {w.get('cause')}"
    if state == "ended":
        return base + f"; ended by {w.get('ended_by')}"
    return base


def _gave_up(v: VersionRef, since: float) -> str | None:
    rec = v.record
    if rec.state == VersionState.FAILED:
        return f"its job failed: {rec.error or 'no error recorded'}"
    for e in reversed(v.registry.audit_log(v.pipeline, limit=50, version=v.version, action="restart")):
        if e.at >= since and e.outcome == "gave_up":
            err = (e.details or {}).get("error") or e.reason or "restart bound reached"
            return f"its job was given up by supervision ({err})"
    return None


def _reject_rate(v: VersionRef) -> float | None:
    from orchestrator.core.tables import count_rows
    from orchestrator.lifecycle.report import offsets_read

    read = offsets_read(v)
    return count_rows(v.paths.rejects) / read if read else None


def _sample(v: VersionRef, w: dict[str, Any], *, actor: str) -> tuple[dict, str | None]:
    """Measure the watched conditions; (the sample, the cause of a rollback or None)."""
    from orchestrator.lifecycle.await_ready import readiness
    from orchestrator.lifecycle.report import check_tables

    spec, version = v.spec, v.version
    gave_up = _gave_up(v, float(w.get("started_at", 0.0)))
    sample: dict[str, Any] = {"at": time.time(), "gave_up": gave_up}
    if gave_up:
        return sample, f"v{version}: {gave_up}"
    r = readiness(v, record=True, actor=actor)
    sample["lag_seconds"] = r.lag_seconds
    limit = spec.watch_lag_limit
    setting = "watch_max_lag_seconds" if spec.watch_max_lag_seconds is not None else "catchup_seconds"
    over = r.lag_seconds is not None and r.lag_seconds > limit
    sample["lag_over"] = int(w.get("lag_over", 0)) + 1 if over else 0
    if over and sample["lag_over"] >= spec.watch_lag_samples:
        return sample, (f"v{version}: lag {r.lag_seconds:.1f} s over the limit {limit:g} s "
                        f"({setting}) for {sample['lag_over']} samples in a row")
    rate = _reject_rate(v)
    sample["reject_rate"] = rate
    if rate is not None and rate > spec.max_reject_rate:
        return sample, (f"v{version}: reject rate {rate:.2%} over the limit {spec.max_reject_rate:.2%} "
                        f"(max_reject_rate)")
    watched = [c for c in spec.checks if c.watch]
    if watched:
        tables, _ = check_tables(v, v.sibling(int(w["standby"])), checks=watched)
        results = run_checks(watched, tables)
        sample["checks"] = {c.name: c.value for c in results}
        failed = [c for c in results if not c.ok]
        if failed:
            c = failed[0]
            return sample, f"v{version}: check {c.name!r} failed on the live table: {c.detail}"
    return sample, None


def _finish(v: VersionRef, w: dict[str, Any], *, actor: str) -> dict[str, Any]:
    """The rollback decided for the version: flip back to the standby (the rollback verb), only while the
    alias still serves it: a promote or rollback by someone since the decision wins."""
    from orchestrator.lifecycle.rollback import finish_rollback, prepare_rollback

    k, pipeline, version = v.k, v.pipeline, v.version
    standby = int(w["standby"])
    reason = f"automatic rollback: {w.get('cause')}"
    plan = prepare_rollback(k, v.spec, standby, actor=ACTOR, reason=reason)
    if not plan.done and plan.from_version != version:   # the flip's compare-and-swap expects from_version
        raise ConflictError(f"automatic rollback of {pipeline} v{version} abandoned: the alias moved to "
                            f"v{plan.from_version} since the decision")
    res = finish_rollback(k, plan, actor=ACTOR, reason=reason, deadline_seconds=ROLLBACK_DEADLINE_SECONDS)
    crashpoint("watch.rolled_back")
    return {"kind": "rolled_back", "pipeline": pipeline, "version": version, "to_version": standby,
            "cause": w.get("cause"), "message": res.message}


def _settle(v: VersionRef, w: dict[str, Any], *, actor: str) -> dict[str, Any] | None:
    """After the automatic rollback's flip (`v.record` read since): publish it if need be, stop (or
    keep) the degraded version, record the outcome once."""
    from orchestrator.jobctl import stop_version
    from orchestrator.lifecycle.promote import finish_interrupted_flip

    k, spec, pipeline, rec = v.k, v.spec, v.pipeline, v.record
    finish_interrupted_flip(k, spec, actor=ACTOR)
    # stopped already: a pass killed after its stop, before recording it
    stopped = spec.watch_on_rollback == "stop" and rec.state == VersionState.STOPPED
    if spec.watch_on_rollback == "stop" and rec.state in (VersionState.STANDBY, VersionState.CAUGHT_UP):
        try:
            stop_version(v, actor=ACTOR, expected_state=rec.state,
                         reason=f"degraded after its promote, kept for inspection (stopped): {w.get('cause')}")
            stopped = True
        except ConflictError as e:
            log.info("degraded %s v%s not stopped: %s", pipeline, rec.version, e)
    try:
        k.registry.update_watch(pipeline, rec.version, expected_state="rolled_back",
                                expected_samples=int(w.get("samples", 0)),
                                watch={**w, "settled": True, "stopped": stopped},
                                audit={"action": "watch", "actor": ACTOR, "outcome": "rolled_back",
                                       "reason": w.get("cause"),
                                       "details": {"to_version": w.get("standby"), "cause": w.get("cause"),
                                                   "degraded": "stopped" if stopped else "kept running"}})
    except ConflictError:
        return None
    return {"kind": "rolled_back", "pipeline": pipeline, "version": rec.version, "to_version": w.get("standby"),
            "cause": w.get("cause"), "degraded": "stopped" if stopped else "kept running"}


def _roll_back(v: VersionRef, w: dict[str, Any], *, actor: str) -> dict[str, Any]:
    """Carry out a decided rollback and settle it; the one action it ends with."""
    pipeline, version = v.pipeline, v.version
    try:
        done = _finish(v, w, actor=actor)
    except ConflictError as e:   # the alias moved since the decision: that move stands
        return {"kind": "abandoned", "pipeline": pipeline, "version": version, "reason": str(e)}
    except KappaError as e:
        return {"kind": "rollback_failed", "pipeline": pipeline, "version": version, "cause": w.get("cause"),
                "error": str(e)}
    after = v.reread()     # the flip changed its record (state, watch)
    return _settle(after, watch_of(after.record) or w, actor=actor) or done


def _move(v: VersionRef, w: dict, new: dict, outcome: str | None, reason: str | None,
          details: dict | None = None) -> bool:
    audit = None if outcome is None else {"action": "watch", "actor": ACTOR, "outcome": outcome, "reason": reason,
                                          "details": details or {}}
    try:
        v.registry.update_watch(v.pipeline, v.version, expected_state=w["state"],
                                expected_samples=int(w.get("samples", 0)), watch=new, audit=audit)
        return True
    except ConflictError as e:
        log.info("%s", e)
        return False


def watch_pass(k: Kappa, spec: PipelineSpec, *, actor: str = ACTOR) -> list[dict[str, Any]]:
    """One pass over the pipeline's watch: sample, decide, roll back, settle. The actions taken."""
    pipeline, reg = spec.name, k.registry
    actions: list[dict[str, Any]] = []
    alias = reg.get_alias(spec.alias)
    for v in k.versions(spec):
        rec = v.record
        w = watch_of(rec)
        if w is None:
            continue
        state = w.get("state")
        if state == "rolled_back" and not w.get("settled"):
            done = _settle(v, w, actor=actor)
            if done:
                actions.append(done)
            continue
        if state not in ("watching", "rolling_back"):
            continue
        serves = alias is not None and alias.pipeline == pipeline and alias.version == rec.version
        if not serves:
            continue  # the flip away from it ended the watch in its transaction
        if state == "rolling_back":   # decided by a pass that died before the flip: finish it
            actions.append(_roll_back(v, w, actor=actor))
            continue
        now = time.time()
        standby = int(w["standby"])
        if now >= float(w.get("until", now)):
            grace = (float(w["until"]) - float(w["started_at"]) if "until" in w and "started_at" in w
                     else spec.grace_period_seconds)   # the promote's own grace, which the watch lasted
            if _move(v, w, {**w, "state": "passed", "ended_at": now}, "passed",
                     f"v{rec.version} healthy through its grace period of {grace:.0f} s",
                     {"samples": w.get("samples", 0)}):
                actions.append({"kind": "passed", "pipeline": pipeline, "version": rec.version})
            continue
        if alias.previous_version != standby or reg.get_version(pipeline, standby).state != VersionState.STANDBY:
            why = f"v{standby} is no longer standby (nothing to roll back to instantly)"
            if _move(v, w, {**w, "state": "ended", "ended_at": now, "ended_by": why},
                     "ended", why):
                actions.append({"kind": "ended", "pipeline": pipeline, "version": rec.version, "reason": why})
            continue
        try:
            sample, cause = _sample(v, w, actor=actor)
        except KappaError as e:
            actions.append({"kind": "sample_failed", "pipeline": pipeline, "version": rec.version, "error": str(e)})
            continue
        samples = int(w.get("samples", 0)) + 1
        if cause is None:
            if _move(v, w, {**w, "samples": samples, "lag_over": sample.get("lag_over", 0),
                                                   "last": sample}, None, None):
                actions.append({"kind": "sampled", "pipeline": pipeline, "version": rec.version, "sample": sample})
            continue
        decided = {**w, "state": "rolling_back", "samples": samples, "last": sample, "cause": cause,
                   "decided_at": now}
        if not _move(v, w, decided, "rolling_back", cause,
                     {"to_version": standby, "sample": sample}):
            continue
        crashpoint("watch.decided")
        actions.append(_roll_back(v, decided, actor=actor))
    return actions
