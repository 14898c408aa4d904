"""The read commands: `pipelines`, `status` (and `--watch`), `history`, `lag-plot`.

They change nothing except that `status --watch` records the lag samples it takes (the same
samples `kappa lag-plot` draws). With `--json` the first three print what scripts rely on.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from orchestrator.cli.app import AsJson, Cli, app, cli_of
from orchestrator.cli.render import history_table, pipelines_table, print_json, status_table
from orchestrator.core.exceptions import ConfigError, KappaError
from orchestrator.core.states import LIVE, VersionState

if TYPE_CHECKING:
    from orchestrator.context import Kappa, VersionRef
    from orchestrator.registry import AliasRecord

__all__ = ["pipelines_data", "status_data", "version_status"]


def pipelines_data(k: Kappa) -> list[dict[str, Any]]:
    """Each declared pipeline as JSON: its spec, its rules versions, what its alias serves, its version count."""
    from jobs.lib.rules.files import available_rules

    out = []
    for name, spec in k.pipelines.items():
        d = spec.model_dump(mode="json")
        d.setdefault("key_columns", list(spec.key_columns))
        rules: list[str] = []
        if spec.ruleset:
            try:
                rules = list(available_rules(spec.ruleset, k.settings.rules_location))
            except KappaError:
                rules = []
        alias = k.registry.get_alias(spec.alias)
        d.update(name=name, rules_versions=rules,
                 serving_version=alias.version if alias is not None else None,
                 versions=len(k.registry.list_versions(name)))
        out.append(d)
    return out


@app.command("pipelines")
def pipelines_cmd(ctx: typer.Context, as_json: AsJson = False) -> None:
    """List the declared pipelines, their rules versions and what their alias serves."""
    cli = cli_of(ctx)
    data = pipelines_data(cli.kappa())
    pipelines_file = cli.settings().pipelines_file
    if as_json:
        print_json({"pipelines_file": str(pipelines_file), "pipelines": data})
    else:
        cli.out.print(pipelines_table(pipelines_file, data))


def version_status(v: VersionRef, alias: AliasRecord | None, *,
                   record: bool = False, rules_cache: dict | None = None) -> dict[str, Any]:
    """One row of `kappa status`: registry record, job, lag and readiness of a version.

    Readiness is decided for running versions only; a version recorded stopped whose job is still
    alive has `stopping` instead (a requested stop under way), not a "failing" readiness.

    `rules_file` compares the rules file of the version's name, as it is now, with the rules the
    version runs (stored at its deploy): "same", "changed", "missing" or "invalid" (None: no rules).
    `rejects` counts the rows of the version's rejects table (`rejects_source`: "job" when its running
    job reported that count, "table" when read from the table's Delta log)."""
    from orchestrator.jobctl import inspect_version
    from orchestrator.jobctl.health import rejects_of
    from orchestrator.lifecycle.await_ready import readiness
    from orchestrator.jobctl.version_rules import file_state

    k, pipeline, rec = v.k, v.pipeline, v.record
    n = rec.version
    row: dict[str, Any] = {
        "version": n,
        "state": rec.state,
        "serving": alias is not None and alias.pipeline == pipeline and alias.version == n,
        "rules_version": rec.rules_version,
        "rules_hash": rec.rules_hash,
        "rules_file": file_state(v, rules_cache if rules_cache is not None else {}),
        "created_at": rec.created_at,
        "watch": (rec.details or {}).get("watch"),
        **backfill_fields(rec.details),   # the backfill's estimate and actual, side by side
        "stopping": None,       # {"requested_by", "requested_at", "reason"} while a stopped version's job ends
    }
    if rec.state == VersionState.RETIRED:
        row.update(job=None, readiness=None, lag=None, partitions={}, eta_seconds=None, rejects=None,
                   rejects_source=None, lag_seconds=None)
        return row
    job = inspect_version(v)
    row["job"] = {"health": job.health, "pid": job.pid if job.alive else None, "batches": job.batches,
                  "rows_in": job.rows_in, "rows_out": job.rows_out, "error": job.error,
                  "reading": job.reading if job.alive else None, "last_batch": job.last_batch}
    row["rejects"], row["rejects_source"] = rejects_of(v, job)
    row.update(_throttle_of(v))
    if rec.state in LIVE:
        r = readiness(v, record=record)
        row.update(readiness=r.state, lag=r.total_lag, partitions=r.partitions, eta_seconds=r.eta_seconds,
                   consecutive_ok=r.consecutive_ok, required_samples=r.required_samples,
                   threshold=r.threshold, reason=r.reason, lag_error=r.lag_error,
                   lag_seconds=r.lag_seconds, catchup_seconds=r.catchup_seconds, catchup_rule=r.rule,
                   lag_floored=r.floored, unread=r.unread)
    else:
        # Not meant to run: no readiness. A job still alive is finishing a stop (it ends its micro-batch).
        row.update(readiness=None, lag=None, partitions={}, eta_seconds=None, lag_seconds=None)
        if job.alive:
            row["stopping"] = _stop_request(v, job.started_at)
    return row


def _throttle_of(v: VersionRef) -> dict[str, Any]:
    """The backfill's share in force and its last changes, for a version that runs with one (or had one)."""
    from orchestrator.lifecycle.throttle import THROTTLED, current_throttle, throttle_changes

    if v.record.state not in THROTTLED and not (v.record.details or {}).get("throttle"):
        return {"throttle": None, "throttle_changes": []}
    return {"throttle": current_throttle(v), "throttle_changes": throttle_changes(v)}


def _stop_request(v: VersionRef, started_at: float | None) -> dict[str, Any]:
    """Who asked the running job of a stopped version to stop, and when: the last `stop_requested`
    entry of the version, unless it is older than the job (a stop of an earlier run)."""
    entries = v.registry.audit_log(v.pipeline, limit=1, version=v.version, action="stop_requested")
    e = entries[-1] if entries else None
    if e is None or (started_at is not None and e.at < started_at - 1.0):
        return {"requested_by": None, "requested_at": None, "reason": None}
    return {"requested_by": e.actor, "requested_at": e.at, "reason": e.reason}


def status_data(k: Kappa, pipelines: list[str], *, record: bool = False) -> list[dict[str, Any]]:
    """`kappa status --json`: per pipeline, its alias and every version's row."""
    out, cache = [], {}
    for name in pipelines:
        spec = k.pipeline(name)
        alias = k.registry.get_alias(spec.alias)
        out.append({
            "pipeline": name,
            "alias": spec.alias,
            "serving_version": alias.version if alias is not None else None,
            "previous_version": alias.previous_version if alias is not None else None,
            "versions": [version_status(v, alias, record=record, rules_cache=cache)
                         for v in k.versions(spec)],
        })
    return out


def _status_pipelines(k: Kappa, pipeline: str | None, all_: bool) -> list[str]:
    if pipeline:
        k.pipeline(pipeline)
        return [pipeline]
    names = list(k.pipelines)
    return names if all_ else [n for n in names if k.registry.list_versions(n)]


@app.command("status")
def status_cmd(
    ctx: typer.Context,
    pipeline: Annotated[Optional[str], typer.Argument(help="one pipeline (default: every pipeline with versions)")] = None,
    all_: Annotated[bool, typer.Option("--all", help="list pipelines without versions too")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="live progress bars of lag going down, until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.5, help="seconds between samples with --watch")] = 2.0,
    until_ready: Annotated[bool, typer.Option("--until-ready", help="with --watch: exit once every running version is ready")] = False,
    as_json: AsJson = False,
) -> None:
    """Every version with its state, lag, ETA and rejects. `--watch` samples lag into the registry."""
    cli = cli_of(ctx)
    k = cli.kappa()
    names = _status_pipelines(k, pipeline, all_)
    if watch:
        if as_json:
            raise typer.BadParameter("--watch draws progress bars; use --json without --watch",
                                     param_hint="--json")
        _watch(cli, k, names, interval, until_ready)
        return
    data = status_data(k, names)
    if as_json:
        print_json({"pipelines": data})
        return
    from orchestrator.lifecycle.watch import describe_watch

    if not data:
        cli.out.print("no pipeline has a version yet: deploy one with `kappa deploy <pipeline>` "
                      "(`kappa pipelines` lists them)")
        return
    for p in data:
        served = "nothing" if p["serving_version"] is None else f"v{p['serving_version']}"
        cli.out.print(f"[bold]{p['pipeline']}[/]: alias {p['alias']} serves {served}")
        for v in p["versions"]:
            if v.get("watch") and (v["watch"].get("state") != "passed" or v["serving"]):
                cli.out.print(f"  {describe_watch(v['version'], v['watch'])}", highlight=False)
    cli.out.print(_with_lag_seconds(status_table(data), data))
    for p in data:
        for v in p["versions"]:
            line = last_batch_line(v)
            if line:
                cli.out.print(f"  {p['pipeline']} {line}", highlight=False, markup=False)
            if v.get("backfill_text"):
                cli.out.print(f"  {p['pipeline']} v{v['version']} {v['backfill_text']}", highlight=False, markup=False)

    from orchestrator.lifecycle.throttle import throttle_lines

    for p in data:
        for v in p["versions"]:
            for line in throttle_lines(v["version"], v.get("throttle"), v.get("throttle_changes") or []):
                cli.out.print(f"  {p['pipeline']} {line}", highlight=False, markup=False)


def backfill_fields(details: dict[str, Any] | None) -> dict[str, Any]:
    """A status row's `estimate` and `backfill` (as stored with the version), their comparison and its line."""
    from orchestrator.observe.estimate import compare, compare_text

    d = details or {}
    return {"estimate": d.get("estimate"), "backfill": d.get("backfill"),
            "estimate_vs_actual": compare(d.get("estimate"), d.get("backfill")), "backfill_text": compare_text(d)}


def last_batch_line(v: dict[str, Any]) -> str | None:
    """'v2 last micro-batch 41: 20 records in 2.41 s, 12 Spark jobs (read and transform 0.90 s, ...)' of a
    version whose job runs and has written a batch."""
    job = v.get("job") or {}
    b = job.get("last_batch")
    if not b or not job.get("pid"):
        return None
    stages = [("read and transform", "read_transform_count"), ("rejects", "rejects"), ("write", "write"),
              ("upkeep", "upkeep")]
    seconds = sum(float(b.get(k) or 0) for _, k in stages)
    parts = ", ".join(f"{name} {float(b.get(k) or 0):.2f} s" for name, k in stages if k in b)
    jobs = f", {b['spark_jobs']} Spark jobs" if b.get("spark_jobs") is not None else ""
    return (f"v{v['version']} last micro-batch {b.get('batch_id')}: {b.get('records', 0):,} records in {seconds:.2f} s"
            f"{jobs} ({parts})")


def _with_lag_seconds(table: Any, data: list[dict[str, Any]]) -> Any:
    """The status table with a "behind" column (lag in seconds) after "lag"."""
    from rich.table import Table

    from orchestrator.observe.lag import fmt_seconds

    cells = []  # one per row of `table`: status_table draws one row per version, or one for none
    for p in data:
        if not p["versions"]:
            cells.append("")
        cells += ["-" if v.get("readiness") is None else fmt_seconds(v.get("lag_seconds")) for v in p["versions"]]
    out = Table(title_justify=table.title_justify, caption=table.caption)
    columns = []
    for col in table.columns:
        out.add_column(col.header, justify=col.justify)
        columns.append(list(col.cells))
        if col.header == "lag":
            out.add_column("behind", justify="right")
            columns.append(cells)
    for row in zip(*columns):
        out.add_row(*row)
    return out


def _watch(cli: Cli, k: Kappa, names: list[str], interval: float, until_ready: bool) -> None:
    from orchestrator.lifecycle.await_ready import readiness
    from orchestrator.observe.progress import LagProgress

    cli.out.print(f"watching {', '.join(names) or 'nothing'} every {interval:g} s (Ctrl-C to stop); "
                  f"each sample is recorded for `kappa lag-plot`")
    specs = k.specs(names)
    with LagProgress(cli.out, line_every=interval) as bars:
        while True:
            states = []
            for spec in specs:
                for v in k.versions(spec):
                    if v.record.state not in LIVE:
                        continue
                    r = readiness(v, record=True)
                    bars.update(r)
                    states.append(r.state)
            if until_ready and states and all(s == "ready" for s in states):
                return
            if until_ready and not states:
                raise ConfigError(f"no version of {', '.join(names)} is running: nothing to wait for")
            time.sleep(interval)


@app.command("history")
def history_cmd(
    ctx: typer.Context,
    pipeline: Annotated[Optional[str], typer.Argument(help="one pipeline (default: all)")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="newest entries to show")] = 50,
    as_json: AsJson = False,
) -> None:
    """The audit log: who did what, when, to which version, why, and the outcome."""
    cli = cli_of(ctx)
    k = cli.kappa()
    if pipeline:
        k.pipeline(pipeline)
    entries = [e.model_dump(mode="json") for e in k.registry.audit_log(pipeline, limit=limit)]
    if as_json:
        print_json({"entries": entries})
    elif not entries:
        cli.out.print("the audit log is empty")
    else:
        cli.out.print(history_table(entries))


@app.command("lag-plot")
def lag_plot_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    version: Annotated[Optional[list[int]], typer.Option("--version", min=1, help="a version to plot (repeatable; default: all)")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="PNG file (default: <home>/plots/<pipeline>-lag.png)")] = None,
) -> None:
    """Write a PNG of each version's lag over time (the catch-up curve) from the registry's samples."""
    from orchestrator.observe.lagplot import plot_pipeline_lag

    cli = cli_of(ctx)
    path = out or Path(cli.settings().home) / "plots" / f"{pipeline}-lag.png"
    written = plot_pipeline_lag(cli.kappa().versions(pipeline, version or None), path)
    cli.out.print(f"wrote {written}")
