"""Is a version caught up? Readiness states as Materialize names them, and a bounded wait.

- hydrating: the job runs and has not caught up yet since it was deployed (backfilling);
- lagging: it had caught up (or serves) but is now behind, or its lag is unknown, or its job is
  finishing a requested stop (the registry no longer counts it as running);
- ready: caught up by the rule below, and the job running with a fresh heartbeat;
- stopped: its job ended on a request (a stop, a shutdown of `kappa up`): not a failure, but not
  ready either (a wait for it ends at once);
- failing: the job failed, hangs, or is not running (or stops while the version should run).

Caught up means caught up, from evidence, not from a threshold alone (one rule for deploy, promote,
the reprocess DAG and a rollback that restarts a stopped version; `catchup_rule_text`):

1. since its job last started, the version has committed at least one micro-batch (the job's own
   count, stored with every lag sample as `batches`), or it has nothing to read (lag 0): a job
   restarted from an old checkpoint has a lag from that checkpoint, which says nothing about
   whether it keeps up now;
2. its lag is within both limits of the pipeline: `catchup_threshold` records and
   `catchup_seconds` seconds (the age of the oldest record not processed yet); unknown lag, of
   either kind, never counts;
3. for `catchup_samples` samples spaced apart: a micro-batch committed between two counted
   samples, or (lag 0, nothing to commit) at least one trigger interval (`TRIGGER_SECONDS`) lies
   between them. Samples closer than that are not counted (they do not break the run either);
4. the lag did not grow across the counted samples: it grows when it rose from each counted sample to
   the next, by more than a tenth of the threshold in all (`growing`); a live tail's lag moves up
   and down by a few records between batches, which is noise, not a trend.

The samples are those taken since the job's current start and within `readiness_window_seconds`
of the newest (default 300 s, `KAPPA_READINESS_WINDOW_SECONDS`), so "N samples" means "lately".
The sample just taken leads the run by its registry id, never by comparing clocks. The count shown
never exceeds the rule's N. The decision carries the rule, its numbers and the samples it was made
from (`Readiness.decision`); the first "ready" of a version moves it to `caught_up` in the registry
with those in the audit log, and promote and rollback record them with their flip. The first recorded sample
after the job wrote its backfill batch keeps the measured backfill in the version's details
(`record_backfill`, once), beside the estimate its deploy stored.

A reading taken from the read progress of a first batch not yet committed (`LagReading.floored`)
is a floor, shown as one (`observe.lag.fmt_lag`), with no ETA.

`wait_ready` raises NotReadyError at its deadline naming the partitions still lagging, or at once
when the job fails or stopped. Deadlines are seconds; `CATCHUP_DEADLINE_SECONDS` is the default wait
for a new version to catch up, whichever front end (CLI or Airflow form) asks.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field, computed_field

from jobs.lib.runtime.args import TRIGGER_SECONDS
from orchestrator.context import VersionRef
from orchestrator.core.exceptions import ConflictError, KappaError, NotReadyError
from orchestrator.core.states import LIVE, VersionState
from orchestrator.core.times import utc_clock
from orchestrator.core.files import tail as log_tail
from orchestrator.core.secrets import mask_secrets
from orchestrator.jobctl import JobStatus, inspect_version
from orchestrator.observe.estimate import backfill_actual, cores_of
from orchestrator.observe.lag import (LagReading, eta_seconds, fmt_lag, fmt_seconds, format_partitions, measure_lag,
                                      sample_lag, sample_seconds, sample_time, version_threshold)

__all__ = ["Readiness", "ReadinessState", "CATCHUP_DEADLINE_SECONDS", "POLL_SECONDS", "readiness", "wait_ready",
           "failing_error", "sample_ok", "within_limits", "counted_samples", "growing",
           "catchup_limits", "catchup_rule_text", "record_backfill", "ENDED"]

log = logging.getLogger(__name__)

ReadinessState = Literal["hydrating", "lagging", "ready", "stopped", "failing"]
#: Readiness states a wait for the version cannot get out of by waiting.
ENDED = frozenset({"failing", "stopped"})
_NEVER_CAUGHT_UP = frozenset({VersionState.CREATED, VersionState.STARTING, VersionState.BACKFILLING})

#: How long a new version may take to catch up from offset zero before a wait for it fails.
CATCHUP_DEADLINE_SECONDS = 7200.0
#: Seconds between two lag samples of a wait.
POLL_SECONDS = 2.0
#: A rise of the lag across the counted samples up to this share of the threshold is the live tail's noise.
GROWTH_NOISE = 0.1


class Readiness(BaseModel):
    """One readiness decision; `samples` (newest first) are the counted samples it was made from."""

    pipeline: str
    version: int
    state: ReadinessState
    total_lag: int | None                    # None: unknown; a floor when `floored`
    partitions: dict[str, int | None]
    eta_seconds: float | None
    consecutive_ok: int                      # samples counted by the rule, at most required_samples
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
    catchup_seconds: float = 60.0            # the pipeline's catchup_seconds
    batches: int | None = None               # micro-batches committed since the job started (None: unknown)
    growing: bool = False                    # the lag grew across the counted samples
    floored: bool = False                    # total_lag is a floor: the first batch is not committed yet
    unread: int | None = None                # with floored: what the read progress says is left
    lag_unreachable: bool = False            # the lag is unknown because the broker could not be reached

    def limits(self) -> str:
        return catchup_limits(self.threshold, self.catchup_seconds)

    @computed_field
    @property
    def rule(self) -> str:
        return catchup_rule_text(self.threshold, self.catchup_seconds, self.required_samples)

    @computed_field
    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def lag_text(self) -> str:
        return fmt_lag(self.total_lag, floored=self.floored, unread=self.unread)

    def decision(self) -> dict[str, Any]:
        """The rule and the numbers a decision was made with, as recorded with it (audit details)."""
        return {"state": self.state, "rule": self.rule, "threshold": self.threshold,
                "catchup_seconds": self.catchup_seconds, "required_samples": self.required_samples,
                "counted": self.consecutive_ok, "batches": self.batches, "growing": self.growing,
                "lag": self.total_lag, "lag_seconds": self.lag_seconds, "samples": self.samples}

    def summary(self) -> str:
        eta = "" if self.eta_seconds is None else f", ETA {self.eta_seconds:.0f} s"
        return (f"{self.pipeline} v{self.version}: {self.state}, lag {self.lag_text()}, "
                f"{fmt_seconds(self.lag_seconds)} behind{eta}, {self.consecutive_ok}/{self.required_samples} "
                f"samples with {self.limits()}; {self.reason}")


def catchup_limits(threshold: int, seconds: float) -> str:
    """The catch-up limits in words: 'lag <= 1,000 records and <= 60 s behind'."""
    return f"lag <= {threshold:,} records and <= {fmt_seconds(seconds)} behind"


def catchup_rule_text(threshold: int, seconds: float, samples: int) -> str:
    """The whole rule with its numbers, as every decision records it."""
    return (f"{catchup_limits(threshold, seconds)} in {samples} samples a micro-batch apart (or "
            f"{TRIGGER_SECONDS:g} s apart with nothing to read), all after a micro-batch committed since "
            f"the job started, the lag not growing across them (by more than a tenth of the threshold)")


def _sample_dict(s: Any) -> dict[str, Any]:
    return {"at": sample_time(s), "total": s.total, "partitions": s.partitions, "lag_seconds": sample_seconds(s),
            "batches": getattr(s, "batches", None)}


def within_limits(sample: dict[str, Any], threshold: int, max_seconds: float) -> bool:
    """Is one sample's lag within both limits? Unknown lag, of either kind, never is."""
    total, seconds = sample.get("total"), sample.get("lag_seconds")
    return total is not None and total <= threshold and seconds is not None and seconds <= max_seconds


def sample_ok(sample: dict[str, Any], threshold: int, max_seconds: float) -> bool:
    """May one sample count? Within both limits, and taken after its job committed a micro-batch
    (or with nothing to read): a lag from the checkpoint of an earlier run is no evidence."""
    return within_limits(sample, threshold, max_seconds) and (
        sample.get("total") == 0 or (sample.get("batches") or 0) >= 1)


def _spaced(older: dict[str, Any], newer: dict[str, Any]) -> bool:
    """A micro-batch committed between the two samples, or, with nothing to read, a trigger interval."""
    b_old, b_new = older.get("batches"), newer.get("batches")
    if b_old is not None and b_new is not None and b_new > b_old:
        return True
    return older.get("total") == 0 and newer.get("total") == 0 and newer["at"] - older["at"] >= TRIGGER_SECONDS


def growing(counted: list[dict[str, Any]], threshold: int) -> bool:
    """Does the lag grow across the counted samples (newest first)? It rose from each one to the next,
    by more than `GROWTH_NOISE` of the threshold (at least one record) in all: 677 -> 783 -> 799 under a
    threshold of 1,000 grows; 16 -> 30, or 40 -> 12 -> 30, is a live tail's noise."""
    lags = [s["total"] for s in reversed(counted)]
    rising = len(lags) >= 2 and all(a < b for a, b in zip(lags, lags[1:]))
    return rising and lags[-1] - lags[0] > max(1.0, GROWTH_NOISE * threshold)


def counted_samples(history: list[dict[str, Any]], threshold: int, max_seconds: float,
                    needed: int) -> list[dict[str, Any]]:
    """The samples the rule counts (newest first, at most `needed`): the run of samples that may
    count since the newest, each spaced from the one counted before it."""
    counted: list[dict[str, Any]] = []
    for s in history:
        if not sample_ok(s, threshold, max_seconds):
            break
        if not counted or _spaced(s, counted[-1]):
            counted.append(s)
            if len(counted) == needed:
                break
    return counted


def readiness(v: VersionRef, record: bool = True, *, threshold: int | None = None,
              actor: str = "kappa") -> Readiness:
    """Measure lag now and decide. `record=True` stores the sample and moves registry states.

    It decides on the registry's record as it is now (`v.reread()`): a wait polls it while the
    version moves from starting to backfilling to caught up, and the move is a compare-and-swap."""
    v = v.reread()
    k, spec, reg, rec, pipeline, version = v.k, v.spec, v.registry, v.record, v.pipeline, v.version
    threshold = version_threshold(v) if threshold is None else threshold
    needed, max_seconds = spec.catchup_samples, spec.catchup_seconds
    # A failed job is not recorded here: the supervisor (reconcile, inside monitor) decides whether
    # it is restarted from its checkpoint or, past its bound, failed.
    job = inspect_version(v)
    batches = job.batches if job.alive else None
    reading: LagReading = sample_lag(v, batches=batches) if record else measure_lag(v)

    since = (job.started_at - 0.001) if job.started_at else None
    oldest = reading.at - k.settings.readiness_window_seconds
    stored = reg.lag_samples(pipeline, version, limit=max(needed, 30) + 5,
                             since=oldest if since is None else max(oldest, since))
    # The store holds the current sample already (record=True): it leads by its id, whatever the clock says.
    history = [_sample_dict(s) for s in reversed(stored) if s.id != reading.sample_id]
    current = {"at": reading.at, "total": reading.total, "partitions": dict(reading.partitions),
               "lag_seconds": reading.lag_seconds, "batches": batches}
    history = [current, *history]
    basis = counted_samples(history, threshold, max_seconds, needed)
    consecutive = len(basis)
    grows = growing(basis, threshold)
    eta = None if reading.floored else eta_seconds(history, threshold, since=since)

    if job.failed:
        state, why = "failing", job.error or "the job failed"
    elif job.health == "stopping" and rec.state not in LIVE:
        state, why = "lagging", "its job is stopping (stop requested)"
    elif job.health in ("stopped", "finished"):
        state, why = "stopped", f"its job {job.health} on a request (pid {job.pid}); start it again with `kappa rollback` " \
                                f"or `kappa start`"
    elif not job.healthy:
        state, why = "failing", f"job is not running ({job.health}); start it with `kappa rollback` or redeploy"
    elif reading.total is None:
        state = "hydrating" if rec.state in _NEVER_CAUGHT_UP else "lagging"
        why = f"lag unknown ({reading.error}); unknown lag never counts as caught up"
    elif reading.lag_seconds is None and job.health == "running":
        state = "hydrating" if rec.state in _NEVER_CAUGHT_UP else "lagging"
        why = "lag in seconds unknown (the oldest unprocessed records could not be fetched); it never counts"
    elif consecutive >= needed and not grows and job.health == "running":
        state, why = "ready", (f"{catchup_limits(threshold, max_seconds)} in {consecutive} samples a micro-batch "
                               f"apart, not growing, {batches if batches is not None else 'no'} micro-batches "
                               f"since the job started, job running")
    else:
        state = "hydrating" if rec.state in _NEVER_CAUGHT_UP else "lagging"
        why = _why_not(job, reading, threshold, max_seconds, batches, basis, needed, grows)

    r = Readiness(pipeline=pipeline, version=version, state=state, total_lag=reading.total,
                  partitions=dict(reading.partitions), eta_seconds=eta, consecutive_ok=consecutive,
                  required_samples=needed, threshold=threshold, job_health=job.health, reason=why, at=reading.at,
                  registry_state=rec.state, lag_error=reading.error, lag_source=reading.source, samples=basis,
                  job=job.model_dump(mode="json"), lag_seconds=reading.lag_seconds, catchup_seconds=max_seconds,
                  batches=batches, growing=grows, floored=reading.floored, unread=reading.unread,
                  lag_unreachable=reading.unreachable and reading.total is None)
    if record:
        record_backfill(v, job.backfill, job.started_at)   # once: the first sample after the backfill batch
        _advance_state(v, r, job, actor)
    return r


def record_backfill(v: VersionRef, measure: dict[str, Any] | None, started_at: float | None) -> bool:
    """Keep the version's measured backfill in its details, once (a compare-and-set: the first process to see it
    writes it); True when written now. Nothing when the job has not reported it or it is recorded already."""
    details = v.record.details or {}
    if not isinstance(measure, dict) or details.get("backfill") is not None:
        return False
    cores, _ = cores_of(v.settings)
    actual = backfill_actual(measure, started_at=started_at, cores=cores, estimate=details.get("estimate"))
    try:
        return v.registry.set_detail_once(v.pipeline, v.version, "backfill", actual)
    except KappaError as e:   # advisory: a readiness sample never fails for it
        log.warning("the backfill of %s was not recorded: %s", v, e)
        return False


def _why_not(job: JobStatus, reading: LagReading, threshold: int, max_seconds: float, batches: int | None,
             basis: list[dict[str, Any]], needed: int, growing: bool) -> str:
    """Why a running (or starting) version is not ready yet, the first reason that holds."""
    if job.health != "running":
        return f"job is {job.health} (not running micro-batches yet)"
    if reading.floored:
        return (f"its first micro-batch has not committed yet: lag {fmt_lag(reading.total, floored=True, unread=reading.unread)}"
                f" is a floor until it does")
    if reading.total > threshold:
        return f"lag {reading.total:,} > threshold {threshold:,} records"
    if reading.lag_seconds is not None and reading.lag_seconds > max_seconds:
        return f"{fmt_seconds(reading.lag_seconds)} behind > catchup_seconds {max_seconds:g}"
    if reading.total > 0 and not batches:
        started = "" if job.started_at is None else f" at {utc_clock(job.started_at, date='never')}"
        return (f"no micro-batch committed since its job started{started}: its lag is from the checkpoint of "
                f"its last run, no evidence that it keeps up")
    if growing:
        return (f"lag grew across the last {len(basis)} samples ({basis[-1]['total']:,} -> {basis[0]['total']:,} "
                f"records)")
    return (f"{len(basis)} of {needed} samples a micro-batch apart with {catchup_limits(threshold, max_seconds)}")


def _advance_state(v: VersionRef, r: Readiness, job: JobStatus, actor: str) -> None:
    S = VersionState
    reg, rec = v.registry, v.record
    try:
        if r.ready and rec.state in (S.STARTING, S.BACKFILLING):
            reg.set_state(r.pipeline, r.version, S.CAUGHT_UP, expected=rec.state)
            reg.audit("caught_up", actor=actor, pipeline=r.pipeline, version=r.version,
                      reason=r.reason, details={**r.decision(), "job": job.describe()})
            r.registry_state = S.CAUGHT_UP
        elif job.health == "running" and rec.state == S.STARTING:
            reg.set_state(r.pipeline, r.version, S.BACKFILLING, expected=S.STARTING)
            reg.audit("backfilling", actor=actor, pipeline=r.pipeline, version=r.version,
                      reason="its job runs micro-batches", details={"job": job.describe(), "lag": r.total_lag,
                                                                    "lag_seconds": r.lag_seconds})
            r.registry_state = S.BACKFILLING
    except ConflictError:  # another process moved it first; its decision stands
        log.info("state of %s v%s changed concurrently", r.pipeline, r.version)


def _not_ready_message(v: VersionRef, r: Readiness, waited: float) -> str:
    paths = v.paths
    if r.total_lag is None:
        lag = f"lag unknown ({r.lag_error})"
    else:
        over = {p: v for p, v in r.partitions.items() if v is not None and v > r.threshold}
        lag = (f"total lag {r.lag_text()} records, {fmt_seconds(r.lag_seconds)} behind, partitions over the "
               f"threshold {r.threshold:,}: {format_partitions(over) if over else 'none now'}")
    eta = "" if r.eta_seconds is None else f"; ETA {r.eta_seconds:.0f} s at the recent rate"
    return (f"{r.pipeline} v{r.version} is not ready after {waited:.0f} s ({r.state}): {lag}; {r.reason}. "
            f"Ready needs {r.rule} ({r.consecutive_ok} of {r.required_samples} samples so far) and a running "
            f"job (job {r.job_health}){eta}. Wait longer (raise the deadline) or check the job log {paths.log_file}")


def failing_error(v: VersionRef, r: Readiness) -> NotReadyError:
    """The error of a wait whose version is failing: why, and the last lines of its job log."""
    tail = r.job.get("log_tail") or mask_secrets(log_tail(v.paths.log_file, 15), v.settings)
    return NotReadyError(f"{r.pipeline} v{r.version} cannot become ready: {r.reason}"
                         + (f"\nlast lines of the job log:\n{tail}" if tail else ""))


def wait_ready(v: VersionRef, *, deadline_seconds: float = CATCHUP_DEADLINE_SECONDS,
               poll_seconds: float = POLL_SECONDS,
               on_sample: Callable[[Readiness], None] | None = None, threshold: int | None = None,
               actor: str = "kappa") -> Readiness:
    """Poll readiness until ready; NotReadyError at the deadline or as soon as the job fails or stopped."""
    start = time.monotonic()
    deadline = start + deadline_seconds
    while True:
        r = readiness(v, record=True, threshold=threshold, actor=actor)
        if on_sample is not None:
            on_sample(r)
        if r.ready:
            return r
        if r.state in ENDED:
            raise failing_error(v, r)
        if time.monotonic() + poll_seconds > deadline:
            raise NotReadyError(_not_ready_message(v, r, time.monotonic() - start))
        time.sleep(poll_seconds)
