"""Is a version caught up? Readiness states as Materialize names them, and a bounded wait.

- hydrating: the job runs and has not caught up yet since it was deployed (backfilling);
- lagging: it had caught up (or serves) but is now behind, or its lag is unknown;
- ready: total lag at or under the threshold for N consecutive samples (all taken since the
  job's current start), and the job running with a fresh heartbeat;
- failing: the job failed, hangs, or is not running.

A sample whose lag is unknown breaks the run of consecutive samples: unknown never counts.
The decision carries the samples it was made from; the first "ready" of a version moves it to
`caught_up` in the registry with those samples in the audit log.

Public API:
- `Readiness` (`.ready`, `.to_dict()`), `readiness(k, pipeline, version, record=True) -> Readiness`
- `wait_ready(k, pipeline, version, *, deadline_seconds, poll_seconds, on_sample=None) -> Readiness`
  (NotReadyError on timeout naming the partitions still lagging, or at once if the job fails)
- `version_threshold(k, pipeline, version) -> int`
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from orchestrator.core.exceptions import ConflictError, NotReadyError
from orchestrator.observe.lag import LagReading, eta_seconds, format_partitions, measure_lag, sample_lag, sample_time, sample_total
from orchestrator.jobctl.control import JobStatus, inspect_version, log_tail, mark_failed

log = logging.getLogger(__name__)

STATES = ("hydrating", "lagging", "ready", "failing")
_NEVER_CAUGHT_UP = ("created", "starting", "backfilling")


@dataclass
class Readiness:
    pipeline: str
    version: int
    state: str                               # hydrating | lagging | ready | failing
    total_lag: int | None                    # None: unknown
    partitions: dict[str, int | None]
    eta_seconds: float | None
    consecutive_ok: int
    required_samples: int
    threshold: int
    job_health: str
    reason: str
    at: float
    registry_state: str | None = None
    lag_error: str | None = None
    lag_source: str | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)   # newest first: the decision's basis
    job: dict[str, Any] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ready"] = self.ready
        return d

    def summary(self) -> str:
        lag = "unknown" if self.total_lag is None else f"{self.total_lag}"
        eta = "" if self.eta_seconds is None else f", ETA {self.eta_seconds:.0f} s"
        return (f"{self.pipeline} v{self.version}: {self.state}, lag {lag}{eta}, "
                f"{self.consecutive_ok}/{self.required_samples} samples <= {self.threshold}; {self.reason}")


def version_threshold(k, pipeline: str, version: int, record: Any = None) -> int:
    """The catch-up threshold of a version: the deploy's override, else the pipeline's."""
    rec = record if record is not None else k.registry.get_version(pipeline, version)
    override = (getattr(rec, "details", None) or {}).get("threshold")
    return k.pipeline(pipeline).catchup_threshold if override is None else int(override)


def _sample_dict(s: Any) -> dict[str, Any]:
    partitions = s.get("partitions") if isinstance(s, dict) else getattr(s, "partitions", None)
    return {"at": sample_time(s), "total": sample_total(s), "partitions": partitions}


def readiness(k, pipeline: str, version: int, record: bool = True, *, threshold: int | None = None,
              actor: str = "kappa") -> Readiness:
    """Measure lag now and decide. `record=True` stores the sample and moves registry states."""
    spec = k.pipeline(pipeline)
    reg = k.registry
    rec = reg.get_version(pipeline, version)
    threshold = version_threshold(k, pipeline, version, rec) if threshold is None else threshold
    needed = spec.catchup_samples
    job = inspect_version(k, pipeline, version)
    if record and job.failed:
        mark_failed(k, job, actor=actor)
    reading: LagReading = sample_lag(k, pipeline, version) if record else measure_lag(k, pipeline, version)

    since = (job.started_at - 0.001) if job.started_at else None
    history = [_sample_dict(s) for s in reg.lag_samples(pipeline, version, limit=max(needed, 30) + 5)]
    history = [s for s in history if since is None or s["at"] >= since]
    current = {"at": reading.at, "total": reading.total, "partitions": dict(reading.partitions)}
    if record:  # the store holds it already; make sure it leads even with a coarse clock
        history = [s for s in history if abs(s["at"] - reading.at) > 1e-3 or s["total"] != reading.total]
    history = sorted([current, *history], key=lambda s: s["at"], reverse=True)
    consecutive = 0
    for s in history:
        if s["total"] is None or s["total"] > threshold:
            break
        consecutive += 1
    basis = history[:needed]
    eta = eta_seconds(history, threshold, since=since)

    if job.failed:
        state, why = "failing", job.error or "the job failed"
    elif not job.healthy:
        state, why = "failing", f"job is not running ({job.health}); start it with `kappa rollback` or redeploy"
    elif reading.total is None:
        state = "hydrating" if rec.state in _NEVER_CAUGHT_UP else "lagging"
        why = f"lag unknown ({reading.error}); unknown lag never counts as caught up"
    elif consecutive >= needed and job.health == "running":
        state, why = "ready", f"lag <= {threshold} for {consecutive} consecutive samples, job running"
    else:
        state = "hydrating" if rec.state in _NEVER_CAUGHT_UP else "lagging"
        if job.health != "running":
            why = f"job is {job.health} (not running micro-batches yet)"
        elif reading.total > threshold:
            why = f"lag {reading.total} > threshold {threshold}"
        else:
            why = f"{consecutive} of {needed} consecutive samples at or under {threshold}"

    r = Readiness(pipeline, version, state, reading.total, dict(reading.partitions), eta, consecutive,
                  needed, threshold, job.health, why, reading.at, rec.state, reading.error,
                  reading.source, basis, job.to_dict())
    if record:
        _advance_state(k, rec, r, job, actor)
    return r


def _advance_state(k, rec: Any, r: Readiness, job: JobStatus, actor: str) -> None:
    reg = k.registry
    try:
        if r.ready and rec.state in ("starting", "backfilling"):
            reg.set_state(r.pipeline, r.version, "caught_up", expected=rec.state)
            reg.audit("caught_up", actor=actor, pipeline=r.pipeline, version=r.version,
                      reason=r.reason, details={"threshold": r.threshold, "required_samples": r.required_samples,
                                                "samples": r.samples, "job": job.describe()})
            r.registry_state = "caught_up"
        elif job.health == "running" and rec.state == "starting":
            reg.set_state(r.pipeline, r.version, "backfilling", expected="starting")
            r.registry_state = "backfilling"
    except ConflictError:  # another process moved it first; its decision stands
        log.info("state of %s v%s changed concurrently", r.pipeline, r.version)


def _not_ready_message(k, r: Readiness, waited: float) -> str:
    paths = k.paths(r.pipeline, r.version)
    if r.total_lag is None:
        lag = f"lag unknown ({r.lag_error})"
    else:
        over = {p: v for p, v in r.partitions.items() if v is not None and v > r.threshold}
        lag = (f"total lag {r.total_lag} records, partitions over the threshold {r.threshold}: "
               f"{format_partitions(over) if over else 'none now'}")
    eta = "" if r.eta_seconds is None else f"; ETA {r.eta_seconds:.0f} s at the recent rate"
    return (f"{r.pipeline} v{r.version} is not ready after {waited:.0f} s ({r.state}): {lag}; ready needs "
            f"lag <= {r.threshold} for {r.required_samples} consecutive samples ({r.consecutive_ok} so far) "
            f"and a running job (job {r.job_health}){eta}. Wait longer (raise the deadline) or check "
            f"the job log {paths.log_file}")


def wait_ready(k, pipeline: str, version: int, *, deadline_seconds: float, poll_seconds: float = 2.0,
               on_sample: Callable[[Readiness], None] | None = None, threshold: int | None = None,
               actor: str = "kappa") -> Readiness:
    """Poll readiness until ready; NotReadyError at the deadline or as soon as the job fails."""
    start = time.monotonic()
    deadline = start + deadline_seconds
    while True:
        r = readiness(k, pipeline, version, record=True, threshold=threshold, actor=actor)
        if on_sample is not None:
            on_sample(r)
        if r.ready:
            return r
        if r.state == "failing":
            tail = r.job.get("log_tail") or log_tail(k.paths(pipeline, version).log_file, 15)
            raise NotReadyError(f"{pipeline} v{version} cannot become ready: {r.reason}"
                                + (f"\nlast lines of the job log:\n{tail}" if tail else ""))
        if time.monotonic() + poll_seconds > deadline:
            raise NotReadyError(_not_ready_message(k, r, time.monotonic() - start))
        time.sleep(poll_seconds)
