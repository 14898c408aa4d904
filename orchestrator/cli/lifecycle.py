"""The commands that change a pipeline: deploy, promote, rollback, stop, retire, retention,
reconcile, monitor. Each calls one verb with the defaults and units the Airflow tasks use
(deadlines in seconds, the promote target of `promote_target`) and prints its result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from orchestrator.cli.app import EXIT_REFUSED, Actor, AsJson, Cli, Reason, app, cli_of, default_actor
from orchestrator.cli.render import json_ready, print_json, print_result
from orchestrator.core.exceptions import ConfigError

if TYPE_CHECKING:
    from orchestrator.context import VersionRef
    from orchestrator.lifecycle.await_ready import Readiness

__all__ = ["wait_with_progress"]

#: Left out, `--deadline` and `--poll` take the verb's defaults, the ones the DAGs' forms show too.
Deadline = Annotated[Optional[float], typer.Option("--deadline", min=1, help="seconds --wait waits at most (default: the kappa_reprocess DAG's catch-up deadline)")]
Poll = Annotated[Optional[float], typer.Option("--poll", min=0.2, help="seconds between lag samples with --wait (default: the DAGs')")]


def _given(**kwargs: Any) -> dict[str, Any]:
    """The options the user set; the rest keep the verb's defaults."""
    return {k: v for k, v in kwargs.items() if v is not None}


@app.command("deploy")
def deploy_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name (see `kappa pipelines`)")],
    rules: Annotated[Optional[str], typer.Option("--rules", help="rules version, e.g. v2 (default: the newest)")] = None,
    threshold: Annotated[Optional[int], typer.Option("--threshold", min=0, help="catch-up threshold in records (default: the pipeline's)")] = None,
    force: Annotated[bool, typer.Option("--force", help="allow a source topic that is not compacted")] = False,
    queue: Annotated[bool, typer.Option("--queue", help="deploy even while another version is in flight")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="then show its lag going down until it is ready")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="make deploy's checks and print what it would do; start and write nothing")] = False,
    deadline: Deadline = None,
    poll: Poll = None,
    actor: Actor = None,
    reason: Reason = None,
    as_json: AsJson = False,
) -> None:
    """Start a new version of a pipeline with the given rules, reading its topics from offset zero.

    With --dry-run nothing is started or written; the exit code is 3 when the deploy would be refused.
    Both print the backfill's estimate: the log's records and bytes per topic, the expected time at the
    rate an earlier version measured (or a default, said so) and the cores.
    """
    from orchestrator.lifecycle.deploy import deploy

    if dry_run and wait:
        raise typer.BadParameter("a dry run starts nothing to wait for; drop --wait", param_hint="--dry-run")
    cli = cli_of(ctx)
    k = cli.kappa()
    spec = k.pipeline(pipeline)
    info = deploy(k, spec, rules, actor=actor or default_actor(), reason=reason, threshold=threshold,
                  force=force, queue=queue, dry_run=dry_run)
    if dry_run:
        _show(cli, info, as_json)
        for line in [] if as_json or info.estimate is None else info.estimate.lines():
            cli.out.print(line, markup=False, highlight=False)
        for w in [] if as_json else info.warnings:
            cli.err.print(f"warning: {w}", markup=False)
        if not info.would_succeed:
            raise typer.Exit(EXIT_REFUSED)
        return
    if not as_json:
        cli.out.print(info.message)
        for w in info.warnings:
            cli.err.print(f"warning: {w}")
        cli.out.print(f"  table {info.table}\n  log   {Path(info.run_dir) / 'job.log'}")
        if info.estimate is not None:
            cli.out.print(f"  {info.estimate.summary()}", markup=False, highlight=False)
    ready = None
    if wait:
        ready = wait_with_progress(cli, k.version(spec, info.version), actor=actor or default_actor(), quiet=as_json,
                                   **_given(deadline_seconds=deadline, poll_seconds=poll))
    if as_json:
        print_json({"version": info, "readiness": ready})
    elif wait:
        cli.out.print(f"{pipeline} v{info.version} is ready: promote it with "
                      f"`kappa promote {pipeline} {info.version}`")
    else:
        cli.out.print(f"watch it with `kappa status {pipeline} --watch`")


def wait_with_progress(cli: Cli, v: VersionRef, *, actor: str, quiet: bool = False,
                       **wait: float) -> Readiness:
    """`wait_ready` drawing the lag going down (on stderr when stdout is for JSON)."""
    from orchestrator.lifecycle.await_ready import POLL_SECONDS, wait_ready
    from orchestrator.observe.progress import LagProgress

    console = cli.err if quiet else cli.out
    with LagProgress(console, line_every=max(wait.get("poll_seconds", POLL_SECONDS), 2.0)) as bars:
        return wait_ready(v, on_sample=bars.update, actor=actor, **wait)


@app.command("promote")
def promote_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    version: Annotated[Optional[int], typer.Argument(min=1, help="version to serve (default: the newest caught-up one)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="check and print exactly what would happen; change nothing")] = False,
    force: Annotated[bool, typer.Option("--force", help="promote although checks failed (not readiness); needs --reason, audited")] = False,
    allow_schema_change: Annotated[bool, typer.Option("--allow-schema-change", help="let a version whose columns were removed or retyped pass the schema check")] = False,
    grace: Annotated[Optional[float], typer.Option("--grace", min=0, help="seconds the replaced version stays a running standby (default: the pipeline's grace_period_seconds)")] = None,
    actor: Actor = None,
    reason: Reason = None,
    as_json: AsJson = False,
) -> None:
    """Check a version's preconditions, validation report and the pipeline's checks, then flip the alias to it.

    With --dry-run nothing changes; the exit code is 3 when the promote would be refused.
    """
    from orchestrator.lifecycle.promote import promote, promote_target
    from orchestrator.observe.render import render_report

    cli = cli_of(ctx)
    k = cli.kappa()
    n = version if version is not None else promote_target(k, pipeline)
    result = promote(k.version(pipeline, n), actor=actor or default_actor(), reason=reason, dry_run=dry_run, force=force,
                     allow_schema_change=allow_schema_change, grace_seconds=grace)
    if as_json:
        print_json(result)
    else:
        render_report(cli.out, result.report)
        print_result(cli.out, result)
    if dry_run and not result.would_succeed:
        raise typer.Exit(EXIT_REFUSED)


def _show(cli: Cli, result: Any, as_json: bool) -> None:
    if as_json:
        print_json(result)
    else:
        print_result(cli.out, result)


@app.command("rollback")
def rollback_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    to: Annotated[Optional[int], typer.Option("--to", min=1, help="version to serve (default: the previous serving one)")] = None,
    deadline: Annotated[Optional[float], typer.Option("--deadline", min=1, help="seconds to wait for a restarted version to catch up (default: the kappa_rollback DAG's)")] = None,
    force: Annotated[bool, typer.Option("--force", help="flip at the deadline even if the version has not caught up; at once to a running standby whose lag is unknown because the broker is unreachable (needs --reason; audited)")] = False,
    actor: Actor = None,
    reason: Reason = None,
    as_json: AsJson = False,
) -> None:
    """Flip the alias back to the previous (or a named) version, restarting its job if needed.

    First says what it costs: an instant flip to a running standby, or a restart from the checkpoint
    (records to catch up, the last such restart's duration), then draws the catch-up until the flip.
    A version not caught up by the deadline is not flipped to (unless --force). A running standby whose
    lag cannot be read (the broker unreachable) is refused at once, in one line (--force flips at once)."""
    from orchestrator.lifecycle.await_ready import POLL_SECONDS
    from orchestrator.lifecycle.rollback import finish_rollback, prepare_rollback
    from orchestrator.observe.progress import LagProgress

    cli = cli_of(ctx)
    k = cli.kappa()
    who = actor or default_actor()
    if force and not (reason or "").strip():
        raise ConfigError(f"rollback of {pipeline} with --force needs a reason (--reason \"...\"): it is recorded in "
                          f"the audit log with the readiness it overrode")
    plan = prepare_rollback(k, k.pipeline(pipeline), to, actor=who, reason=reason)
    console = cli.err if as_json else cli.out
    if not plan.done:
        console.print(plan.message, markup=False)
    wait = _given(deadline_seconds=deadline)
    if plan.restarted:
        with LagProgress(console, line_every=max(POLL_SECONDS, 2.0)) as bars:
            result = finish_rollback(k, plan, actor=who, reason=reason, on_sample=bars.update, force=force, **wait)
    else:
        result = finish_rollback(k, plan, actor=who, reason=reason, force=force, **wait)
    _show(cli, result, as_json)


@app.command("stop")
def stop_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    version: Annotated[int, typer.Argument(min=1, help="version whose job to stop")],
    force: Annotated[bool, typer.Option("--force", help="stop even the serving version's job (freezes what readers see)")] = False,
    actor: Actor = None,
    reason: Reason = None,
    as_json: AsJson = False,
) -> None:
    """Stop a version's job after its micro-batch in flight, within the pipeline's stop_timeout_seconds
    (keeps its table and checkpoint)."""
    from orchestrator.jobctl import inspect_version, stop_version
    from orchestrator.jobctl.stop import stop_bound

    cli = cli_of(ctx)
    k = cli.kappa()
    v = k.version(pipeline, version)
    if inspect_version(v).alive:
        (cli.err if as_json else cli.out).print(
            f"stopping {pipeline} v{version}: its micro-batch in flight finishes and no new one starts; at most "
            f"{stop_bound(v.spec):g} s (stop_timeout_seconds), then it is stopped at once", markup=False)
    result = stop_version(v, actor=actor or default_actor(), reason=reason, force=force)
    _show(cli, result, as_json)


@app.command("retire")
def retire_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    version: Annotated[int, typer.Argument(min=1, help="version to retire")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print what would be deleted; delete nothing")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation (needed when stdin is not a terminal)")] = False,
    actor: Actor = None,
    reason: Reason = None,
    as_json: AsJson = False,
) -> None:
    """Stop a version's job and delete its table, checkpoint and consumer group.

    On a terminal it shows what it would delete and asks first; elsewhere (a script, a pipe) it needs
    --yes, and without it refuses (exit 3) deleting nothing.
    """
    from orchestrator.lifecycle.retire import retire

    cli = cli_of(ctx)
    k = cli.kappa()
    actor = actor or default_actor()
    v = k.version(pipeline, version)
    if not dry_run and not yes:
        _confirm_retire(cli, v, actor=actor, reason=reason)
    result = retire(v, actor=actor, reason=reason, dry_run=dry_run)
    _show(cli, result, as_json)


def _on_a_terminal() -> bool:
    """Whether someone can answer a question: stdin is a terminal."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):  # closed or replaced stdin
        return False


def _confirm_retire(cli: Cli, v: VersionRef, *, actor: str, reason: str | None) -> None:
    """Show what retiring would delete and ask; RefusedError when no one can answer or the answer is no."""
    from orchestrator.core.exceptions import RefusedError
    from orchestrator.lifecycle.retire import retire

    pipeline, version = v.pipeline, v.version
    if not _on_a_terminal():
        raise RefusedError(f"not retiring {pipeline} v{version}: it deletes the version's table, checkpoint and "
                           f"consumer group, and stdin is not a terminal to confirm it on; pass --yes "
                           f"(see what it would delete with --dry-run)")
    plan = retire(v, actor=actor, reason=reason, dry_run=True)  # refuses a protected version
    print_result(cli.err, plan)
    if not typer.confirm(f"Retire {pipeline} v{version}? This cannot be undone", default=False, err=True):
        raise RefusedError(f"not retiring {pipeline} v{version}: not confirmed; nothing was deleted")


@app.command("retention")
def retention_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    apply: Annotated[bool, typer.Option("--apply", help="retire the versions beyond keep_versions (default: dry run)")] = False,
    actor: Actor = None,
    as_json: AsJson = False,
) -> None:
    """Keep the pipeline's last K versions; show (or with --apply, retire) the older ones."""
    from orchestrator.lifecycle.retire import apply_retention

    cli = cli_of(ctx)
    result = apply_retention(cli.kappa(), cli.kappa().pipeline(pipeline), actor=actor or default_actor(), dry_run=not apply)
    _show(cli, result, as_json)


@app.command("reconcile")
def reconcile_cmd(ctx: typer.Context, actor: Actor = None, as_json: AsJson = False) -> None:
    """Repair what a crash left half done (alias published late, dead jobs not yet marked failed)."""
    from orchestrator.lifecycle.reconcile import reconcile

    cli = cli_of(ctx)
    actions = reconcile(cli.kappa(), actor=actor or default_actor())
    if as_json:
        print_json({"actions": actions})
        return
    if not actions:
        cli.out.print("nothing to reconcile: the registry, the published aliases and the jobs agree")
        return
    for d in json_ready(actions):
        where = f"{d.get('pipeline')}" + (f" v{d['version']}" if d.get("version") is not None else "")
        rest = {k: v for k, v in d.items() if k not in ("kind", "pipeline", "version")}
        cli.out.print(f"{d.get('kind', 'action')}: {where} {json.dumps(rest, ensure_ascii=False)}", markup=False)


@app.command("monitor")
def monitor_cmd(ctx: typer.Context, actor: Actor = None, as_json: AsJson = False) -> None:
    """One monitoring pass: sample lag, detect failed jobs, reconcile, stop expired standbys."""
    from orchestrator.lifecycle.monitor import monitor

    cli = cli_of(ctx)
    report = monitor(cli.kappa(), actor=actor or default_actor(), raise_on_problem=False)
    if as_json:
        print_json(report)
    else:
        from orchestrator.lifecycle.monitor import report_lines

        for line in report_lines(report):
            (cli.err if line.startswith(("problem: ", "error: ")) else cli.out).print(line, markup=False)
    if report.problems:
        raise typer.Exit(1)
