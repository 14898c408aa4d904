"""Deploy: start a new version of a pipeline, reading its source topics from offset zero.

Everything is checked before anything is allocated: the pipeline exists, its job module and
rules are there, the rules file validates (its content hash is recorded with the version), and
every source topic exists and is compacted. A topic with `cleanup.policy=delete` has lost old
records, so reading it from offset zero cannot rebuild the table: refused unless `force`.

Then the registry allocates the next version number (refusing a second reprocess while one is
in flight, unless queued), the version's job starts with a continuous trigger, and the deploy
is audited. Re-running a deploy is resumable: a version allocated but never started (the
orchestrator died in between) with the same rules is started instead of allocating another, and
one whose job already runs is reported as such.

`check_request` is the first half on its own (the Airflow DAG's validate task): it changes nothing.
`deploy(dry_run=True)` makes every check deploy makes (the request, the topics, a version in flight
or resumable) and says what it would do, writing nothing: no registry row, no audit entry, no file
(a SQLite registry that does not exist yet is not created).

Both estimate the backfill first (`orchestrator.observe.estimate`: the log's records and bytes, the rate
measured on an earlier version or a default, the cores; the dry run's bytes are the segment sizes from
Kafka's LogDirsCommand, a deploy's the sampled average record size; the cores less those the
pipeline's running jobs use now, sampled for a second); a deploy stores it in the new version's
`details["estimate"]` in the transaction that allocates it. A broker that cannot tell makes the
estimate unknown, with the reason; the deploy goes on as it would without it.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.exceptions import ConfigError, KappaError, SourceRefusedError, is_refusal
from orchestrator.context import Kappa, VersionRef
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.core.states import IN_FLIGHT, VersionState
from orchestrator.jobctl import inspect_version, mark_failed, start_version
from orchestrator.core.checks import CheckResult as Check
from orchestrator.jobctl.version_rules import stored_rules
from orchestrator.observe.estimate import BackfillEstimate, estimate_backfill

__all__ = ["DeployPlan", "DeployPreview", "VersionInfo", "check_request", "check_topics", "deploy", "code_ref"]

log = logging.getLogger(__name__)


class DeployPlan(BaseModel):
    """A checked deploy request: what `deploy` would start, with the warnings a forced check gave."""

    model_config = ConfigDict(frozen=True)

    pipeline: str
    job: str
    topics: tuple[str, ...]
    rules_version: str | None
    rules_file: str | None
    rules_hash: str | None
    threshold: int
    force: bool
    warnings: tuple[str, ...] = ()
    #: the rules file's text as read and validated, stored with the version (never in the audit log)
    rules_text: str | None = Field(default=None, exclude=True, repr=False)


class VersionInfo(BaseModel):
    """A deployed (or resumed) version: its registry state, where it writes, and its job."""

    model_config = ConfigDict(frozen=True)

    pipeline: str
    version: int
    state: VersionState
    rules_version: str | None
    rules_hash: str | None
    code_ref: str | None
    threshold: int
    table: str
    rejects: str
    checkpoint: str
    run_dir: str
    group_id: str
    pid: int | None
    job_started: bool
    resumed: bool
    message: str
    warnings: list[str] = Field(default_factory=list)
    #: The backfill estimate stored with the version at its allocation (`orchestrator.observe.estimate`).
    estimate: BackfillEstimate | None = None


class DeployPreview(BaseModel):
    """What `deploy(dry_run=True)` found: the checks a deploy makes, then what it would do (`actions`) or
    why it would refuse (`error`, `would_succeed` false). Nothing was written."""

    model_config = ConfigDict(frozen=True)

    pipeline: str
    dry_run: bool = True
    would_succeed: bool
    #: The version the deploy would allocate, resume, or find already running.
    version: int | None
    resumed: bool = False
    message: str
    checks: list[Check] = Field(default_factory=list)
    actions: list[str] = Field(default_factory=list)
    plan: DeployPlan | None = None
    warnings: list[str] = Field(default_factory=list)
    error: str | None = None
    #: What the backfill would take: the log's size, the rate, the cores (`orchestrator.observe.estimate`).
    estimate: BackfillEstimate | None = None


def code_ref() -> str:
    """The git commit of the code a version runs ('<sha>' or '<sha>-dirty'), else the package version."""
    import orchestrator

    root = Path(orchestrator.__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return f"{sha}-dirty" if dirty else sha
    except (OSError, subprocess.SubprocessError):
        return f"kappa-{orchestrator.__version__}"


def _topic_policies(k: Kappa, topics: tuple[str, ...]) -> dict[str, tuple[str | None, bool]]:
    """{topic: (cleanup.policy, whether it is the broker's default rather than the topic's own)}."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    from orchestrator.observe.lag import kafka_error, topic_partitions

    topic_partitions(k, topics)  # BrokerError naming a missing topic
    try:
        futures = k.admin().describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics],
                                             request_timeout=10)
        out = {}
        for res, fut in futures.items():
            entry = fut.result().get("cleanup.policy")
            out[res.name] = (None, True) if entry is None else (entry.value, bool(getattr(entry, "is_default", False)))
        return out
    except Exception as e:
        raise kafka_error("topic configurations", k, e) from None


def check_topics(k: Kappa, spec: PipelineSpec, *, force: bool = False) -> list[str]:
    """Every source topic exists and is compacted; a delete-policy topic only with `force`."""
    warnings = []
    for topic, (policy, default) in _topic_policies(k, tuple(spec.topics)).items():
        effective = policy or "delete"
        policies = {p.strip() for p in effective.split(",")}
        if policies == {"compact"}:
            continue
        # Apache Kafka reports a topic without a policy of its own as the broker's default, "delete"
        shown = f"no cleanup.policy (the broker default, {effective})" if default else f"cleanup.policy={policy}"
        why = (f"source topic {topic!r} of pipeline {spec.name!r} has {shown}: the broker deletes old "
               f"records of such a topic, so reading it from offset zero cannot rebuild the whole table")
        if not force:
            raise SourceRefusedError(f"{why}. Set cleanup.policy=compact on the topic, or pass --force to "
                              f"reprocess from what the log still holds")
        warnings.append(why + " (forced)")
    return warnings


def check_request(k: Kappa, spec: PipelineSpec, rules_version: str | None = None, *, force: bool = False,
                  threshold: int | None = None) -> DeployPlan:
    """Validate a deploy request without changing anything."""
    plan = _check_spec(k, spec, rules_version, threshold=threshold, force=force)
    warnings = check_topics(k, spec, force=force)
    return plan.model_copy(update={"warnings": tuple(warnings)})


def _check_spec(k: Kappa, spec: PipelineSpec, rules_version: str | None, *, threshold: int | None,
                force: bool) -> DeployPlan:
    """The checks of a deploy request that need no broker: pipeline, job module, threshold, rules file."""
    from orchestrator.core.pipelines import check_ruleset_exists
    from orchestrator.jobctl.jobcheck import check_job_exists

    from jobs.lib.rules.files import rules_root

    pipeline = spec.name
    if _own_job(spec.job):
        check_job_exists(spec)
    check_ruleset_exists(spec, rules_dir=rules_root(k.settings.rules_location))
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0):
        raise ConfigError(f"invalid catch-up threshold {threshold!r}: expected a number of records >= 0")
    rules_file = rules_hash = rules_text = None
    if spec.ruleset:
        from jobs.lib.rules.files import available_rules, rules_path
        from orchestrator.jobctl.version_rules import read_rules_file

        location = k.settings.rules_location
        if rules_version is None:
            known = available_rules(spec.ruleset, location)
            if not known:
                raise ConfigError(f"pipeline {pipeline!r} uses ruleset {spec.ruleset!r}, which has no rules files "
                                  f"in {rules_root(location) / spec.ruleset} (rules_location); add "
                                  f"<version>.toml files there")
            rules_version = known[-1]
        path = rules_path(spec.ruleset, rules_version, location)
        rules, rules_text = read_rules_file(path)
        rules_file, rules_hash = str(path), rules.content_hash
    elif rules_version is not None:
        raise ConfigError(f"pipeline {pipeline!r} (job {spec.job!r}) takes no rules, but rules version "
                          f"{rules_version!r} was given; drop it")
    if not _own_job(spec.job):   # a team's job: imported and called on a Kafka stream, what it returns checked
        check_job_exists(spec, job_path=k.settings.job_folders, call=True, rules_file=rules_file)
    if spec.checks:
        from orchestrator.lifecycle.report import check_pipeline_checks

        check_pipeline_checks(k, spec)
    return DeployPlan(pipeline=pipeline, job=spec.job, topics=tuple(spec.topics), rules_version=rules_version,
                      rules_file=rules_file, rules_hash=rules_hash, rules_text=rules_text if spec.ruleset else None,
                      force=force,
                      threshold=spec.catchup_threshold if threshold is None else threshold)


def _own_job(job: str) -> bool:
    from orchestrator.core.jobref import OWN_PACKAGE, parse_job_ref

    return parse_job_ref(job)[0].split(".")[0] == OWN_PACKAGE


def _info(v: VersionRef, plan: DeployPlan, *, pid: int | None, started: bool, resumed: bool, message: str,
          ref: str) -> VersionInfo:
    paths = v.paths
    stored = (v.record.details or {}).get("estimate")
    return VersionInfo(
        pipeline=v.pipeline, version=v.version, state=v.reread().record.state,   # as the start left it
        rules_version=plan.rules_version, rules_hash=plan.rules_hash, code_ref=ref, threshold=plan.threshold,
        table=str(paths.table), rejects=str(paths.rejects), checkpoint=str(paths.checkpoint),
        run_dir=str(paths.run_dir), group_id=paths.group_id, pid=pid, job_started=started, resumed=resumed,
        message=message, warnings=list(plan.warnings),
        estimate=BackfillEstimate.model_validate(stored) if isinstance(stored, dict) else None)


def _resumable(k: Kappa, spec: PipelineSpec, plan: DeployPlan, actor: str) -> tuple[VersionRef | None, Any]:
    """An in-flight version with the same rules, for a re-run deploy to continue with."""
    for v in sorted(k.versions(spec), key=lambda v: v.version, reverse=True):
        rec = v.record
        if rec.state not in IN_FLIGHT:
            continue
        st = inspect_version(v)
        if rec.state != VersionState.CREATED and st.failed:
            mark_failed(k, st, actor=actor)  # no longer in flight: a new version may be allocated
            continue
        if rec.rules_hash == plan.rules_hash and rec.rules_version == plan.rules_version:
            return v, st
    return None, None


def _preview(k: Kappa, spec: PipelineSpec, rules_version: str | None, *, actor: str, reason: str | None,
             threshold: int | None, force: bool, queue: bool) -> DeployPreview:
    """`deploy`'s checks and decisions, read-only: what it would allocate, resume or refuse.

    Mirrors `deploy`, `_resumable` and the registry's in-flight refusal (`Registry.allocate_version`)
    without their writes. A check that fails with an error (unknown pipeline, invalid rules, no broker)
    raises as in `deploy`; one that would be a refusal (`is_refusal`) is reported in the preview.
    """
    from orchestrator.serving import registry_file_missing

    pipeline = spec.name
    plan = _check_spec(k, spec, rules_version, threshold=threshold, force=force)
    rules = (f"rules {plan.rules_version} ({plan.rules_file}, hash {plan.rules_hash[:12]})" if plan.rules_version
             else f"no rules (job {plan.job!r} takes none)")
    checks = [Check(name="pipeline", ok=True, detail=f"{pipeline}: job {plan.job!r} on topics "
                                                     f"{', '.join(plan.topics)}, catch-up threshold {plan.threshold}"),
              Check(name="rules", ok=True, detail=f"{rules} validates")]
    refusals: list[str] = []
    try:
        warnings = check_topics(k, spec, force=force)
        checks.append(Check(name="topics", ok=True, detail="; ".join(warnings) or "every source topic exists and "
                                                                                 "is compacted"))
    except KappaError as e:
        if not is_refusal(e):
            raise
        warnings = []
        checks.append(Check(name="topics", ok=False, detail=str(e)))
        refusals.append(str(e))
    plan = plan.model_copy(update={"warnings": tuple(warnings)})
    refs = [] if registry_file_missing(k.settings) else k.versions(spec)
    records = [v.record for v in refs]
    actions: list[str] = []
    dead: set[int] = set()
    if not queue:
        for v in sorted(refs, key=lambda v: v.version, reverse=True):
            rec = v.record
            if rec.state not in IN_FLIGHT:
                continue
            st = inspect_version(v)
            if rec.state != VersionState.CREATED and st.failed:
                actions.append(f"record {pipeline} v{rec.version} as failed ({st.error})")
                dead.add(rec.version)
                continue
            if rec.rules_hash == plan.rules_hash and rec.rules_version == plan.rules_version:
                return _resume_preview(v, plan, st, checks, actions, refusals, actor, reason)
    busy = [r for r in records if r.in_flight and r.version not in dead]
    if busy and not queue:
        b = busy[0]
        why = (f"pipeline {pipeline!r} already has v{b.version} in flight (state {b.state}); refusing a second "
               f"reprocess. Promote or stop v{b.version} first (kappa stop {pipeline} {b.version}), or queue this "
               f"one (--queue)")
        checks.append(Check(name="in_flight", ok=False, detail=why))
        refusals.append(why)
    else:
        checks.append(Check(name="in_flight", ok=True, detail=(
            f"queued behind {', '.join(f'v{r.version}' for r in busy)} (--queue)" if busy else
            "no other version of the pipeline is in flight")))
    last = [r.last_version for r in k.registry.list_pipelines() if r.name == pipeline] if records else []
    n = max([r.version for r in records] + last + [0]) + 1
    paths = k.paths(pipeline, n)       # the paths of a version not allocated yet
    actions += [f"allocate {pipeline} v{n} with {rules}",
                f"start its job from offset zero: table {paths.table}, checkpoint {paths.checkpoint}, consumer "
                f"group {paths.group_id}, log {paths.log_file}",
                f"record the deploy by {actor!r}: {reason or '(no reason given)'}"]
    return _preview_result(plan, n, False, checks, actions, refusals,
                           f"dry run: would deploy {pipeline} v{n} (rules {plan.rules_version or '-'})")


def _resume_preview(v: VersionRef, plan: DeployPlan, st, checks: list[Check], actions: list[str],
                    refusals: list[str], actor: str, reason: str | None) -> DeployPreview:
    p, n = plan.pipeline, v.version
    if st.alive:
        checks.append(Check(name="in_flight", ok=True, detail=f"v{n} has the same rules and its job runs"))
        return _preview_result(plan, n, True, checks, actions, refusals,
                               f"dry run: {p} v{n} with rules {plan.rules_version} is already deployed and its job "
                               f"runs (pid {st.pid}); deploy would do nothing")
    checks.append(Check(name="in_flight", ok=True, detail=f"v{n} has the same rules and was never started: resume it"))
    actions += [f"start the job of {p} v{n} (resume its deploy; log {v.paths.log_file})",
                f"record the deploy by {actor!r}: {reason or '(no reason given)'}"]
    return _preview_result(plan, n, True, checks, actions, refusals, f"dry run: would resume the deploy of {p} v{n}")


def _preview_result(plan: DeployPlan, n: int, resumed: bool, checks: list[Check], actions: list[str],
                    refusals: list[str], message: str) -> DeployPreview:
    error = "; ".join(refusals) or None
    return DeployPreview(pipeline=plan.pipeline, would_succeed=error is None, version=n, resumed=resumed,
                         message=f"dry run: would refuse. {error}" if error else message, checks=checks,
                         actions=[] if error else actions, plan=plan, warnings=list(plan.warnings), error=error)


def deploy(k: Kappa, spec: PipelineSpec, rules_version: str | None = None, *, actor: str, reason: str | None = None,
           threshold: int | None = None, force: bool = False, queue: bool = False,
           start: bool = True, dry_run: bool = False) -> VersionInfo | DeployPreview:
    """Check the request, allocate the next version, start its job from offset zero, audit.

    `dry_run` makes the same checks and returns a `DeployPreview` of what it would do, writing nothing."""
    if dry_run:
        from orchestrator.serving import registry_file_missing

        preview = _preview(k, spec, rules_version, actor=actor, reason=reason, threshold=threshold, force=force,
                           queue=queue)
        history = [] if registry_file_missing(k.settings) else None   # a dry run creates no registry
        return preview.model_copy(update={"estimate": estimate_backfill(k, spec, history=history, busy=True)})
    reg, pipeline = k.registry, spec.name
    try:
        plan = check_request(k, spec, rules_version, force=force, threshold=threshold)
    except KappaError as e:
        reg.audit("deploy", actor=actor, pipeline=pipeline, reason=reason, outcome="refused",
                  details={"rules_version": rules_version, "error": str(e)})
        raise
    ref = code_ref()

    v, st = (None, None) if queue else _resumable(k, spec, plan, actor)
    if v is not None:
        if st is not None and st.alive:
            msg = (f"{pipeline} v{v.version} with rules {plan.rules_version} is already deployed and its job "
                   f"runs (pid {st.pid}); not deploying it twice (pass queue to deploy another version)")
            reg.audit("deploy", actor=actor, pipeline=pipeline, version=v.version, reason=reason,
                      outcome="noop", details={"message": msg})
            return _info(v, plan, pid=st.pid, started=False, resumed=True, message=msg, ref=ref)
        res = start_version(v, actor=actor, reason=reason or "resume deploy")
        reg.audit("deploy", actor=actor, pipeline=pipeline, version=v.version, reason=reason,
                  details={"resumed": True, "pid": res.pid, **plan.model_dump(mode="json")})
        return _info(v, plan, pid=res.pid, started=res.started, resumed=True,
                     message=f"resumed the deploy of {pipeline} v{v.version}: {res.message}", ref=ref)

    # unknown, with the reason, when the broker cannot tell; bytes from a sample of records (a deploy does
    # not start a JVM for Kafka's LogDirsCommand: `--dry-run` does, for the segment sizes)
    estimate = estimate_backfill(k, spec, bytes_mode="sample", busy=True)
    try:
        rec = _allocate(k, plan, ref, actor, reason, queue, estimate)
    except KappaError as e:
        reg.audit("deploy", actor=actor, pipeline=pipeline, reason=reason, outcome="refused",
                  details={"rules_version": plan.rules_version, "error": str(e)})
        raise
    v = VersionRef.of_record(k, spec, rec)     # the new version, resolved once from its allocation
    if not start:
        return _info(v, plan, pid=None, started=False, resumed=False,
                     message=f"allocated {pipeline} v{rec.version}; its job is not started", ref=ref)
    try:
        res = start_version(v, actor=actor, reason=reason)
    except KappaError as e:
        reg.audit("deploy", actor=actor, pipeline=pipeline, version=rec.version, reason=reason,
                  outcome="failed", details={"error": str(e)})
        raise
    reg.audit("deploy", actor=actor, pipeline=pipeline, version=rec.version, reason=reason,
              details={"pid": res.pid, "code_ref": ref, **plan.model_dump(mode="json")})
    return _info(v, plan, pid=res.pid, started=True, resumed=False,
                 message=f"deployed {pipeline} v{rec.version} (rules {plan.rules_version or '-'}): {res.message}",
                 ref=ref)


def _allocate(k: Kappa, plan: DeployPlan, ref: str, actor: str, reason: str | None, queue: bool,
              estimate: BackfillEstimate):
    """Allocate the next version, with its backfill estimate; its paths follow from the number the registry picks."""
    return k.registry.allocate_version(
        plan.pipeline, rules_version=plan.rules_version, rules_hash=plan.rules_hash, code_ref=ref,
        paths=lambda n: k.paths(plan.pipeline, n), actor=actor, reason=reason, queue=queue,
        details={"threshold": plan.threshold, "force": plan.force, "rules_file": plan.rules_file,
                 "warnings": list(plan.warnings), "estimate": estimate.model_dump(mode="json"), **stored_rules(plan)},
    )
