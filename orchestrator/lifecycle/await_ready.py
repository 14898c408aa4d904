"""Is a version caught up? Readiness states as Materialize names them, and a bounded wait.

- hydrating: the job runs and has not caught up yet since it was deployed (backfilling);
- lagging: it had caught up (or serves) but is now behind, or its lag is unknown, or its job is
  finishing a requested stop (the registry no longer counts it as running);
- ready: lag within the pipeline's catch-up rule for N consecutive recent samples (all taken since
  the job's current start, and within `readiness_window_seconds` of the newest), and the job
  running with a fresh heartbeat;
- failing: the job failed, hangs, or is not running (or stops while the version should run).

The catch-up rule (`PipelineSpec.catchup_rule_used`, recorded as `rule` in every decision and in
the `caught_up` audit entry): "records" (total lag <= `catchup_threshold`, the default), "seconds"
(lag in seconds, the age of the oldest unprocessed record, <= `catchup_max_lag_seconds`) or "both".
A sample whose lag is unknown (in records, or in seconds when the rule uses seconds) breaks the run of consecutive samples: unknown never counts.
Old samples do not count either: one fresh sample and two from an hour ago are one sample, not
three. The window is the setting `readiness_window_seconds` (default 300 s, `KAPPA_READINESS_WINDOW_SECONDS`):
wide enough for N samples at the slowest sampler's pace (the monitor, once a minute; a wait polls
every `POLL_SECONDS`, an Airflow sensor in bursts), narrow enough that "N samples" means "lately".
A window rather than a maximum gap between samples, so the rule reads the same whoever samples.
The sample just taken leads the run by its registry id, never by comparing clocks, so samples
taken within one tick of a coarse clock still count once each.
The decision carries the samples it was made from; the first "ready" of a version moves it to
`caught_up` in the registry with those samples in the audit log.

`wait_ready` raises NotReadyError at its deadline naming the partitions still lagging, or at once
when the job fails. Deadlines are seconds; `CATCHUP_DEADLINE_SECONDS` is the default wait for a
new version to catch up, whichever front end (CLI or Airflow form) asks.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field, computed_field

from orchestrator.core.exceptions import ConflictError, NotReadyError
from orchestrator.core.kappa import Kappa
from orchestrator.core.states import LIVE, VersionState
from orchestrator.core.files import tail as log_tail
from orchestrator.core.secrets import mask_secrets
from orchestrator.jobctl import JobStatus, inspect_version
from orchestrator.observe.lag import (LagReading, eta_seconds, fmt_seconds, format_partitions, measure_lag, sample_lag,
                                      sample_seconds, sample_time)

__all__ = ["Readiness", "ReadinessState", "CATCHUP_DEADLINE_SECONDS", "POLL_SECONDS", "readiness", "wait_ready",
           "failing_error", "version_threshold", "sample_ok", "catchup_limits"]

log = logging.getLogger(__name__)

ReadinessState = Literal["hydrating", "lagging", "ready", "failing"]
_NEVER_CAUGHT_UP = frozenset({VersionState.CREATED, VersionState.STARTING, VersionState.BACKFILLING})

#: How long a new version may take to catch up from offset zero before a wait for it fails.
CATCHUP_DEADLINE_SECONDS = 7200.0
#: Seconds between two lag samples of a wait.
POLL_SECONDS = 2.0


class Readiness(BaseModel):
    """One readiness decision; `samples` (newest first) are the lag samples it was made from."""

    pipeline: str
    version: int
    state: ReadinessState
    total_lag: int | None                    # None: unknown
    partitions: dict[str, int | None]
    eta_seconds: float | None
    consecutive_ok: int
    required_samples: int
    threshold: int
    job_health: str
    reason: str
    at: float
    registry_state: VersionState | None = None
    lag_error: str | None = None
    lag_source: str | None = None
    samples: list[dict[str, Any]] = Field(default_factory=list)
    job: dict[str, Any] = Field(default_factory=dict)
    lag_seconds: float | None = None         # age of the oldest unprocessed record; None: unknown
    max_lag_seconds: float | None = None     # the pipeline's catchup_max_lag_seconds
    rule: Literal["records", "seconds", "both"] = "records"

    def limits(self) -> str:
        return catchup_limits(self.rule, self.threshold, self.max_lag_seconds)

    @computed_field
    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def summary(self) -> str:
        lag = "unknown" if self.total_lag is None else f"{self.total_lag}"
        eta = "" if self.eta_seconds is None else f", ETA {self.eta_seconds:.0f} s"
        if self.rule == "records":
            return (f"{self.pipeline} v{self.version}: {self.state}, lag {lag}{eta}, "
                    f"{self.consecutive_ok}/{self.required_samples} samples <= {self.threshold}; {self.reason}")
        return (f"{self.pipeline} v{self.version}: {self.state}, lag {lag}, {fmt_seconds(self.lag_seconds)} "
                f"behind{eta}, {self.consecutive_ok}/{self.required_samples} samples with {self.limits()} "
                f"(rule {self.rule!r}); {self.reason}")


def version_threshold(k: Kappa, pipeline: str, version: int, record: Any = None) -> int:
    """The catch-up threshold of a version: the deploy's override, else the pipeline's."""
    rec = record if record is not None else k.registry.get_version(pipeline, version)
    override = (rec.details or {}).get("threshold")
    return k.pipeline(pipeline).catchup_threshold if override is None else int(override)


def catchup_limits(rule: str, threshold: int, max_seconds: float | None) -> str:
    """A catch-up rule's limits in words: 'lag <= 1000', 'lag <= 1000 and oldest unprocessed <= 30 s'."""
    seconds = f"oldest unprocessed record <= {fmt_seconds(max_seconds)} old"
    if rule == "seconds":
        return seconds
    if rule == "both":
        return f"lag <= {threshold} and {seconds}"
    return f"lag <= {threshold}"


def _sample_dict(s: Any) -> dict[str, Any]:
    return {"at": sample_time(s), "total": s.total, "partitions": s.partitions, "lag_seconds": sample_seconds(s)}


def sample_ok(sample: dict[str, Any], rule: str, threshold: int, max_lag_seconds: float | None) -> bool:
    """Does one sample meet the catch-up rule? Unknown lag (of a kind the rule uses) never does."""
    total, seconds = sample.get("total"), sample.get("lag_seconds")
    records_ok = total is not None and total <= threshold
    seconds_ok = seconds is not None and max_lag_seconds is not None and seconds <= max_lag_seconds
    if rule == "seconds":
        return total is not None and seconds_ok     # an unknown record lag is an unreadable log
    if rule == "both":
        return records_ok and seconds_ok
    return records_ok


def readiness(k: Kappa, pipeline: str, version: int, record: bool = True, *, threshold: int | None = None,
              actor: str = "kappa") -> Readiness:
    """Measure lag now and decide. `record=True` stores the sample and moves registry states."""
    spec = k.pipeline(pipeline)
    reg = k.registry
    rec = reg.get_version(pipeline, version)
    threshold = version_threshold(k, pipeline, version, rec) if threshold is None else threshold
    needed = spec.catchup_samples
    rule, max_seconds = spec.catchup_rule_used, spec.catchup_max_lag_seconds
    # A failed job is not recorded here: the supervisor (reconcile, inside monitor) decides whether
    # it is restarted from its checkpoint or, past its bound, failed.
    job = inspect_version(k, pipeline, version)
    reading: LagReading = sample_lag(k, pipeline, version) if record else measure_lag(k, pipeline, version)

    since = (job.started_at - 0.001) if job.started_at else None
    oldest = reading.at - k.settings.readiness_window_seconds
    stored = reg.lag_samples(pipeline, version, limit=max(needed, 30) + 5,
                             since=oldest if since is None else max(oldest, since))
    # The store holds the current sample already (record=True): it leads by its id, whatever the clock says.
    history = [_sample_dict(s) for s in reversed(stored) if s.id != reading.sample_id]
    current = {"at": reading.at, "total": reading.total, "partitions": dict(reading.partitions),
               "lag_seconds": reading.lag_seconds}
    history = [current, *history]
    consecutive = 0
    for s in history:
        if not sample_ok(s, rule, threshold, max_seconds):
            break
        consecutive += 1
    basis = history[:needed]
    eta = eta_seconds(history, 0 if rule == "seconds" else threshold, since=since)

    if job.failed:
        state, why = "failing", job.error or "the job failed"
    elif job.health == "stopping" and rec.state not in LIVE:
        state, why = "lagging", "its job is stopping (stop requested)"
    elif not job.healthy:
        state, why = "failing", f"job is not running ({job.health}); start it with `kappa rollback` or redeploy"
    elif reading.total is None:
        state = "hydrating" if rec.state in _NEVER_CAUGHT_UP else "lagging"
        why = f"lag unknown ({reading.error}); unknown lag never counts as caught up"
    elif rule != "records" and reading.lag_seconds is None and job.health == "running":
        state = "hydrating" if rec.state in _NEVER_CAUGHT_UP else "lagging"
        why = (f"lag in seconds unknown (the oldest unprocessed records could not be fetched); the "
               f"{rule!r} catch-up rule never counts it as caught up")
    elif consecutive >= needed and job.health == "running":
        state, why = "ready", f"{catchup_limits(rule, threshold, max_seconds)} for {consecutive} consecutive samples, job running"
    else:
        state = "hydrating" if rec.state in _NEVER_CAUGHT_UP else "lagging"
        if job.health != "running":
            why = f"job is {job.health} (not running micro-batches yet)"
        elif rule != "seconds" and reading.total > threshold:
            why = f"lag {reading.total} > threshold {threshold}"
        elif rule != "records" and reading.lag_seconds is not None and reading.lag_seconds > max_seconds:
            why = f"lag {fmt_seconds(reading.lag_seconds)} > catchup_max_lag_seconds {max_seconds:g}"
        elif rule == "records":
            why = f"{consecutive} of {needed} consecutive samples at or under {threshold}"
        else:
            why = f"{consecutive} of {needed} consecutive samples with {catchup_limits(rule, threshold, max_seconds)}"

    r = Readiness(pipeline=pipeline, version=version, state=state, total_lag=reading.total,
                  partitions=dict(reading.partitions), eta_seconds=eta, consecutive_ok=consecutive,
                  required_samples=needed, threshold=threshold, job_health=job.health, reason=why, at=reading.at,
                  registry_state=rec.state, lag_error=reading.error, lag_source=reading.source, samples=basis,
                  job=job.model_dump(mode="json"), lag_seconds=reading.lag_seconds, max_lag_seconds=max_seconds,
                  rule=rule)
    if record:
        _advance_state(k, rec, r, job, actor)
    return r


def _advance_state(k: Kappa, rec: Any, r: Readiness, job: JobStatus, actor: str) -> None:
    S = VersionState
    reg = k.registry
    try:
        if r.ready and rec.state in (S.STARTING, S.BACKFILLING):
            reg.set_state(r.pipeline, r.version, S.CAUGHT_UP, expected=rec.state)
            reg.audit("caught_up", actor=actor, pipeline=r.pipeline, version=r.version,
                      reason=r.reason, details={"rule": r.rule, "threshold": r.threshold,
                                                "max_lag_seconds": r.max_lag_seconds,
                                                "required_samples": r.required_samples,
                                                "samples": r.samples, "job": job.describe()})
            r.registry_state = S.CAUGHT_UP
        elif job.health == "running" and rec.state == S.STARTING:
            reg.set_state(r.pipeline, r.version, S.BACKFILLING, expected=S.STARTING)
            reg.audit("backfilling", actor=actor, pipeline=r.pipeline, version=r.version,
                      reason="its job runs micro-batches", details={"job": job.describe(), "lag": r.total_lag,
                                                                    "lag_seconds": r.lag_seconds})
            r.registry_state = S.BACKFILLING
    except ConflictError:  # another process moved it first; its decision stands
        log.info("state of %s v%s changed concurrently", r.pipeline, r.version)


def _not_ready_message(k: Kappa, r: Readiness, waited: float) -> str:
    paths = k.paths(r.pipeline, r.version)
    if r.total_lag is None:
        lag = f"lag unknown ({r.lag_error})"
    else:
        over = {p: v for p, v in r.partitions.items() if v is not None and v > r.threshold}
        lag = (f"total lag {r.total_lag} records, partitions over the threshold {r.threshold}: "
               f"{format_partitions(over) if over else 'none now'}")
    eta = "" if r.eta_seconds is None else f"; ETA {r.eta_seconds:.0f} s at the recent rate"
    if r.lag_seconds is not None:
        eta += f"; the oldest unprocessed record is {fmt_seconds(r.lag_seconds)} old"
    return (f"{r.pipeline} v{r.version} is not ready after {waited:.0f} s ({r.state}): {lag}; ready needs "
            f"{r.limits()} for {r.required_samples} consecutive samples ({r.consecutive_ok} so far) "
            f"and a running job (job {r.job_health}){eta}. Wait longer (raise the deadline) or check "
            f"the job log {paths.log_file}")


def failing_error(k: Kappa, r: Readiness) -> NotReadyError:
    """The error of a wait whose version is failing: why, and the last lines of its job log."""
    tail = r.job.get("log_tail") or mask_secrets(log_tail(k.paths(r.pipeline, r.version).log_file, 15), k.settings)
    return NotReadyError(f"{r.pipeline} v{r.version} cannot become ready: {r.reason}"
                         + (f"\nlast lines of the job log:\n{tail}" if tail else ""))


def wait_ready(k: Kappa, pipeline: str, version: int, *, deadline_seconds: float = CATCHUP_DEADLINE_SECONDS,
               poll_seconds: float = POLL_SECONDS,
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
            raise failing_error(k, r)
        if time.monotonic() + poll_seconds > deadline:
            raise NotReadyError(_not_ready_message(k, r, time.monotonic() - start))
        time.sleep(poll_seconds)
