"""`kappa`: reprocess, watch, promote and roll back pipeline versions from a terminal.

Every command is a thin layer over one verb of the control plane (`orchestrator.lifecycle.deploy`,
`promote`, `rollback`, ...): it resolves the settings (flag > environment > config file >
default, in `orchestrator.core.settings.resolve_settings`), calls the verb, and prints what it returned.
The verbs raise `KappaError`s whose messages already say what is wrong and how to fix it; this
module is the only place that turns them into one line on stderr and exit code 1 (usage errors
exit 2). Read commands (`pipelines`, `status`, `history`) print JSON with `--json`.

Global options come before the command: `kappa --home /tmp/k status`. When no bootstrap servers
are configured, commands use the embedded broker that `kappa broker start` left running under
the kappa home (`<home>/broker.json`).
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import logging
import math
import os
import signal
import sys
import time
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from orchestrator.core.exceptions import ConfigError, KappaError

BROKER_FILE = "broker.json"


# -- errors -------------------------------------------------------------------------------------

def error_line(e: BaseException) -> str:
    """The one line a KappaError becomes: its message, on one line."""
    text = " ".join(part.strip() for part in str(e).splitlines() if part.strip())
    return f"Error: {text or type(e).__name__}"


class KappaGroup(TyperGroup):
    """Turns every KappaError raised by a command into one line on stderr and exit code 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KappaError as e:
            typer.echo(error_line(e), err=True)
            raise typer.Exit(1) from None


def _typer(**kw) -> typer.Typer:
    return typer.Typer(cls=KappaGroup, no_args_is_help=True, add_completion=False,
                       pretty_exceptions_enable=False, rich_markup_mode=None, **kw)


app = _typer(name="kappa", help=(
    "kappa: re-derive a streaming table from a compacted Kafka topic into a new version, watch it "
    "catch up, flip the serving alias atomically, roll back. Start with `kappa demo`."))
bench_app = _typer(help="Benchmarks: reprocess throughput, deploy-to-promote time, flip latency.")
airflow_app = _typer(help="Run Airflow for kappa on this machine (api-server, scheduler, dag-processor, triggerer).")
trigger_app = _typer(help="Trigger kappa's Airflow DAGs through Airflow's REST API and follow the run.")
broker_app = _typer(help="The embedded Kafka-protocol broker (tansu), in the background for terminal use.")
app.add_typer(bench_app, name="bench")
app.add_typer(airflow_app, name="airflow")
app.add_typer(trigger_app, name="trigger")
app.add_typer(broker_app, name="broker")


# -- state shared by the commands ---------------------------------------------------------------

class Cli:
    """What the global options resolved to; builds Settings and the Kappa facade on first use."""

    def __init__(self, overrides: dict[str, Any], config_file: Path | None = None) -> None:
        self.overrides = {k: v for k, v in overrides.items() if v is not None}
        self.config_file = config_file
        self._settings = None
        self._kappa = None
        from orchestrator.observe.progress import make_console

        self.out = make_console()
        self.err = make_console(stderr=True)

    def settings(self):
        if self._settings is None:
            from orchestrator.core.settings import resolve_settings

            s = resolve_settings(self.config_file, **self.overrides)
            if s.bootstrap_servers is None:
                running = read_broker_file(s.home)
                if running is not None:
                    s = resolve_settings(self.config_file, **{**self.overrides,
                                                              "bootstrap_servers": running["bootstrap_servers"]})
            self._settings = s
        return self._settings

    def kappa(self):
        if self._kappa is None:
            from orchestrator.core.kappa import Kappa

            self._kappa = Kappa(self.settings())
        return self._kappa

    def close(self) -> None:
        if self._kappa is not None:
            self._kappa.close()
            self._kappa = None


def _cli(ctx: typer.Context) -> Cli:
    obj = ctx.find_root().obj
    if not isinstance(obj, Cli):  # a sub-app invoked on its own (tests)
        obj = Cli({})
        ctx.find_root().obj = obj
    return obj


def default_actor() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user database entry (some containers)
        return os.environ.get("USER") or f"uid{os.getuid()}"


def _plain(obj: Any) -> Any:
    """A JSON-ready value from a verb's result (to_dict, dataclass, pydantic, datetime, Path)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)  # "inf": strict JSON has no infinity
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain(v) for v in obj]
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Enum):
        return obj.value
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        return _plain(obj.to_dict())
    if hasattr(obj, "model_dump"):
        return _plain(obj.model_dump(mode="json"))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    return str(obj)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(_plain(data), indent=2, ensure_ascii=False))


def _fmt_time(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        value = datetime.fromtimestamp(value, timezone.utc)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


# -- global options -----------------------------------------------------------------------------

@app.callback()
def _global(
    ctx: typer.Context,
    home: Annotated[Optional[Path], typer.Option("--home", help="kappa home (KAPPA_HOME; default ./.kappa)")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="config file (KAPPA_CONFIG; default <home>/kappa.toml)")] = None,
    registry_url: Annotated[Optional[str], typer.Option("--registry-url", help="registry database URL (KAPPA_REGISTRY_URL)")] = None,
    bootstrap_servers: Annotated[Optional[str], typer.Option("--bootstrap-servers", help="Kafka bootstrap servers (KAPPA_BOOTSTRAP_SERVERS; default: the embedded broker)")] = None,
    kafka_config: Annotated[Optional[str], typer.Option("--kafka-config", help="extra librdkafka settings as a JSON object (KAPPA_KAFKA_CONFIG)")] = None,
    pipelines_file: Annotated[Optional[Path], typer.Option("--pipelines-file", help="pipelines file (KAPPA_PIPELINES)")] = None,
    warehouse: Annotated[Optional[Path], typer.Option("--warehouse", help="Delta tables root (KAPPA_WAREHOUSE)")] = None,
    state_dir: Annotated[Optional[Path], typer.Option("--state-dir", help="checkpoints and run dirs (KAPPA_STATE_DIR)")] = None,
    group_prefix: Annotated[Optional[str], typer.Option("--group-prefix", help="consumer group prefix (KAPPA_GROUP_PREFIX)")] = None,
    spark_master: Annotated[Optional[str], typer.Option("--spark-master", help="Spark master for jobs (KAPPA_SPARK_MASTER)")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log what kappa does (INFO) to stderr")] = False,
) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.ERROR,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not verbose:
        logging.getLogger("kappa.kafka").setLevel(logging.CRITICAL)
    ctx.obj = Cli(dict(home=home, registry_url=registry_url, bootstrap_servers=bootstrap_servers,
                       kafka_config=kafka_config, pipelines_file=pipelines_file, warehouse=warehouse,
                       state_dir=state_dir, group_prefix=group_prefix, spark_master=spark_master),
                  config_file=config)
    ctx.call_on_close(ctx.obj.close)


Actor = Annotated[Optional[str], typer.Option("--actor", help="who does this, for the audit log (default: the OS user)")]
Reason = Annotated[Optional[str], typer.Option("--reason", help="why, for the audit log")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]


# -- pipelines ----------------------------------------------------------------------------------

def pipelines_data(k) -> list[dict[str, Any]]:
    out = []
    for name, spec in k.pipelines.items():
        d = _plain(spec)
        rules: list[str] = []
        if getattr(spec, "ruleset", None):
            from jobs.lib.rules import available_rules

            try:
                rules = list(available_rules(spec.ruleset))
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
    cli = _cli(ctx)
    data = pipelines_data(cli.kappa())
    if as_json:
        print_json({"pipelines_file": str(cli.settings().pipelines_file), "pipelines": data})
        return
    t = Table(title=f"pipelines ({cli.settings().pipelines_file})", title_justify="left")
    for col in ("pipeline", "job", "topics", "key", "rules", "alias", "serving", "versions"):
        t.add_column(col)
    for d in data:
        key = d.get("key")
        t.add_row(d["name"], str(d.get("job")), ", ".join(d.get("topics") or []),
                  ", ".join(key) if isinstance(key, list) else str(key),
                  ", ".join(d["rules_versions"]) or "-", str(d.get("alias")),
                  "-" if d["serving_version"] is None else f"v{d['serving_version']}", str(d["versions"]))
    cli.out.print(t)


# -- deploy -------------------------------------------------------------------------------------

@app.command("deploy")
def deploy_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name (see `kappa pipelines`)")],
    rules: Annotated[Optional[str], typer.Option("--rules", help="rules version, e.g. v2 (default: the newest)")] = None,
    threshold: Annotated[Optional[int], typer.Option("--threshold", min=0, help="catch-up threshold in records (default: the pipeline's)")] = None,
    force: Annotated[bool, typer.Option("--force", help="allow a source topic that is not compacted")] = False,
    queue: Annotated[bool, typer.Option("--queue", help="deploy even while another version is in flight")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="then show its lag going down until it is ready")] = False,
    deadline: Annotated[float, typer.Option("--deadline", min=1, help="seconds --wait waits at most")] = 1800.0,
    poll: Annotated[float, typer.Option("--poll", min=0.2, help="seconds between lag samples with --wait")] = 2.0,
    actor: Actor = None,
    reason: Reason = None,
    as_json: AsJson = False,
) -> None:
    """Start a new version of a pipeline with the given rules, reading its topics from offset zero."""
    from orchestrator.lifecycle.deploy import deploy

    cli = _cli(ctx)
    k = cli.kappa()
    info = deploy(k, pipeline, rules, actor=actor or default_actor(), reason=reason, threshold=threshold,
                  force=force, queue=queue)
    if not as_json:
        cli.out.print(info.message)
        for w in info.warnings:
            cli.err.print(f"warning: {w}")
        cli.out.print(f"  table {info.table}\n  log   {Path(info.run_dir) / 'job.log'}")
    ready = None
    if wait:
        ready = wait_with_progress(cli, k, pipeline, info.version, deadline=deadline, poll=poll,
                                   actor=actor or default_actor(), quiet=as_json)
    if as_json:
        print_json({"version": info, "readiness": ready})
    elif wait:
        cli.out.print(f"{pipeline} v{info.version} is ready: promote it with "
                      f"`kappa promote {pipeline} {info.version}`")
    else:
        cli.out.print(f"watch it with `kappa status {pipeline} --watch`")


def wait_with_progress(cli: Cli, k, pipeline: str, version: int, *, deadline: float, poll: float,
                       actor: str, quiet: bool = False):
    from orchestrator.lifecycle.await_ready import wait_ready
    from orchestrator.observe.progress import LagProgress

    console = cli.err if quiet else cli.out
    with LagProgress(console, line_every=max(poll, 2.0)) as bars:
        return wait_ready(k, pipeline, version, deadline_seconds=deadline, poll_seconds=poll,
                          on_sample=bars.update, actor=actor)


# -- status -------------------------------------------------------------------------------------

LIVE_STATES = ("starting", "backfilling", "caught_up", "serving", "standby")


def version_status(k, pipeline: str, rec: Any, alias: Any, *, record: bool = False) -> dict[str, Any]:
    """One row of `kappa status`: registry record, job, lag and readiness of a version."""
    from orchestrator.lifecycle.await_ready import readiness
    from orchestrator.jobctl.control import inspect_version

    n = rec.version
    row: dict[str, Any] = {
        "version": n,
        "state": rec.state,
        "serving": alias is not None and alias.pipeline == pipeline and alias.version == n,
        "rules_version": getattr(rec, "rules_version", None),
        "rules_hash": getattr(rec, "rules_hash", None),
        "created_at": _plain(getattr(rec, "created_at", None)),
    }
    if rec.state == "retired":
        row.update(job=None, readiness=None, lag=None, partitions={}, eta_seconds=None, rejects=None)
        return row
    job = inspect_version(k, pipeline, n)
    row["job"] = {"health": job.health, "pid": job.pid if job.alive else None, "batches": job.batches,
                  "rows_in": job.rows_in, "rows_out": job.rows_out, "error": job.error}
    row["rejects"] = job.rejects
    if rec.state in LIVE_STATES or job.alive:
        r = readiness(k, pipeline, n, record=record)
        row.update(readiness=r.state, lag=r.total_lag, partitions=r.partitions, eta_seconds=r.eta_seconds,
                   consecutive_ok=r.consecutive_ok, required_samples=r.required_samples,
                   threshold=r.threshold, reason=r.reason, lag_error=r.lag_error)
    else:
        row.update(readiness=None, lag=None, partitions={}, eta_seconds=None)
    return row


def status_data(k, pipelines: list[str], *, record: bool = False) -> list[dict[str, Any]]:
    out = []
    for name in pipelines:
        spec = k.pipeline(name)
        alias = k.registry.get_alias(spec.alias)
        versions = sorted(k.registry.list_versions(name), key=lambda r: r.version)
        out.append({
            "pipeline": name,
            "alias": spec.alias,
            "serving_version": alias.version if alias is not None else None,
            "previous_version": getattr(alias, "previous_version", None) if alias is not None else None,
            "versions": [version_status(k, name, rec, alias, record=record) for rec in versions],
        })
    return out


def _status_pipelines(k, pipeline: str | None, all_: bool) -> list[str]:
    if pipeline:
        k.pipeline(pipeline)
        return [pipeline]
    names = list(k.pipelines)
    return names if all_ else [n for n in names if k.registry.list_versions(n)]


def status_table(data: list[dict[str, Any]]) -> Table:
    from orchestrator.observe.progress import fmt_count, fmt_eta

    t = Table(title_justify="left")
    for col in ("pipeline", "version", "state", "readiness", "lag", "ETA", "rejects", "rules", "job"):
        t.add_column(col, justify="right" if col in ("lag", "rejects") else "left")
    for p in data:
        if not p["versions"]:
            t.add_row(p["pipeline"], "-", "no versions", "", "", "", "", "", "")
        for v in p["versions"]:
            job = v.get("job") or {}
            jtext = job.get("health", "-")
            if job.get("pid"):
                jtext += f" (pid {job['pid']})"
            t.add_row(p["pipeline"], f"v{v['version']}" + (" *" if v["serving"] else ""), v["state"],
                      v.get("readiness") or "-",
                      "-" if v.get("readiness") is None else fmt_count(v.get("lag")),
                      "-" if v.get("readiness") is None else fmt_eta(v.get("eta_seconds")),
                      "-" if v.get("rejects") is None else f"{v['rejects']:,}",
                      v.get("rules_version") or "-", jtext)
    t.caption = "* serves the pipeline's alias"
    return t


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
    cli = _cli(ctx)
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
    if not data:
        cli.out.print("no pipeline has a version yet: deploy one with `kappa deploy <pipeline>` "
                      "(`kappa pipelines` lists them)")
        return
    for p in data:
        served = "nothing" if p["serving_version"] is None else f"v{p['serving_version']}"
        cli.out.print(f"[bold]{p['pipeline']}[/]: alias {p['alias']} serves {served}")
    cli.out.print(status_table(data))


def _watch(cli: Cli, k, names: list[str], interval: float, until_ready: bool) -> None:
    from orchestrator.lifecycle.await_ready import readiness
    from orchestrator.observe.progress import LagProgress

    cli.out.print(f"watching {', '.join(names) or 'nothing'} every {interval:g} s (Ctrl-C to stop); "
                  f"each sample is recorded for `kappa lag-plot`")
    with LagProgress(cli.out, line_every=interval) as bars:
        while True:
            states = []
            for name in names:
                for rec in sorted(k.registry.list_versions(name), key=lambda r: r.version):
                    if rec.state not in LIVE_STATES:
                        continue
                    r = readiness(k, name, rec.version, record=True)
                    bars.update(r)
                    states.append(r.state)
            if until_ready and states and all(s == "ready" for s in states):
                return
            if until_ready and not states:
                raise ConfigError(f"no version of {', '.join(names)} is running: nothing to wait for")
            time.sleep(interval)


# -- promote, rollback, stop, retire, retention, reconcile -------------------------------------

def render_report(console: Console, report: dict[str, Any] | None) -> None:
    """The validation report, for people: key counts, rejects, and what the new rules changed."""
    if not report:
        return
    from orchestrator.observe.progress import fmt_count

    pipeline, n, old = report.get("pipeline"), report.get("version"), report.get("serving_version")
    rules = report.get("rules_version") or "-"
    head = f"validation report: {pipeline} v{n} (rules {rules})"
    if old is not None:
        head += f" against serving v{old} (rules {report.get('serving_rules_version') or '-'})"
    console.print(f"[bold]{head}[/]", highlight=False)

    def verdict(ok: Any) -> str:
        return "-" if ok is None else ("[green]ok[/]" if ok else "[red]OVER THE LIMIT[/]")

    if old is None:
        console.print(f"  keys: {fmt_count(report.get('keys_new'))} (nothing served yet to compare with)",
                      highlight=False)
    else:
        ratio = report.get("key_delta_ratio")
        ratio_s = f"{ratio:.2%}" if isinstance(ratio, (int, float)) else str(ratio)
        console.print(f"  keys: {fmt_count(report.get('keys_new'))} in v{n}, {fmt_count(report.get('keys_serving'))} "
                      f"in v{old}: difference {ratio_s}, tolerance {report.get('key_count_tolerance', 0):.2%} "
                      f"{verdict(report.get('key_count_ok'))}", highlight=False)
    console.print(f"  rejects: {fmt_count(report.get('rejects'))} of {fmt_count(report.get('offsets_read'))} records "
                  f"read ({report.get('reject_rate', 0):.2%}, limit {report.get('max_reject_rate', 0):.2%}) "
                  f"{verdict(report.get('reject_rate_ok'))}", highlight=False)
    if old is not None:
        by_col = ", ".join(f"{c}: {fmt_count(v)}" for c, v in (report.get("changed_by_column") or {}).items())
        console.print(f"  rows compared (keys in both): {fmt_count(report.get('rows_compared'))}; changed by the "
                      f"new rules: [bold]{fmt_count(report.get('rows_changed'))}[/]" + (f" ({by_col})" if by_col else ""),
                      highlight=False)
        if report.get("rows_input_differs"):
            console.print(f"  rows whose input differs (live updates one version has read and the other not "
                          f"yet): {fmt_count(report.get('rows_input_differs'))}", highlight=False)
        only_new, only_old = report.get("keys_only_new") or 0, report.get("keys_only_serving") or 0
        if only_new or only_old:
            console.print(f"  keys only in v{n}: {fmt_count(only_new)}, only in v{old}: {fmt_count(only_old)}",
                          highlight=False)
        for col, changes in (report.get("top_changes") or {}).items():
            if not changes:
                continue
            t = Table(title=f"top changes of {col}: v{old} -> v{n}", title_justify="left")
            t.add_column("rows", justify="right")
            t.add_column(f"v{old}")
            t.add_column(f"v{n}")
            for ch in changes:
                t.add_row(f"{ch['count']:,}", str(ch["old"]), str(ch["new"]))
            console.print(t)
    for problem in report.get("problems") or []:
        console.print(f"  [red]problem:[/] {problem}", highlight=False)
    if report.get("path"):
        console.print(f"  [dim]saved to {report['path']}[/]", highlight=False)


def _latest_version(k, pipeline: str) -> int:
    from orchestrator.core.exceptions import NotFoundError

    versions = [r.version for r in k.registry.list_versions(pipeline)]
    if not versions:
        raise NotFoundError(f"pipeline {pipeline!r} has no versions; deploy one with `kappa deploy {pipeline}`")
    return max(versions)


def _print_result(cli: Cli, result: Any, as_json: bool) -> None:
    """A verb's result: its message, then what it checked and what it did (or would do)."""
    if as_json:
        print_json(result)
        return
    d = _plain(result)
    if not isinstance(d, dict):
        cli.out.print(json.dumps(d, indent=2, ensure_ascii=False), markup=False)
        return
    for check in d.get("checks") or []:
        mark = "ok" if check.get("ok") else "FAILED"
        cli.out.print(f"check {check.get('name')}: {mark} - {check.get('detail')}", markup=False)
    msg = d.get("message")
    cli.out.print(msg if msg else json.dumps(d, indent=2, ensure_ascii=False), markup=False)
    label = "would" if d.get("dry_run") else "did"
    for action in d.get("actions") or []:
        cli.out.print(f"  {label}: {action}", markup=False)
    for done in d.get("done") or []:
        cli.out.print(f"  done: {done}", markup=False)
    for res in d.get("results") or []:
        if res.get("error"):
            cli.out.print(f"  v{res.get('version')}: {res['error']}", markup=False)
        else:
            for action in res.get("actions") or []:
                cli.out.print(f"  v{res.get('version')}: {label} {action}", markup=False)


@app.command("promote")
def promote_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    version: Annotated[Optional[int], typer.Argument(min=1, help="version to serve (default: the newest)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="check and print exactly what would happen; change nothing")] = False,
    actor: Actor = None,
    reason: Reason = None,
    as_json: AsJson = False,
) -> None:
    """Check a version's preconditions and validation report, then flip the alias to it.

    With --dry-run nothing changes; the exit code is 1 when the promote would be refused.
    """
    from orchestrator.lifecycle.promote import promote

    cli = _cli(ctx)
    k = cli.kappa()
    n = version if version is not None else _latest_version(k, pipeline)
    result = promote(k, pipeline, n, actor=actor or default_actor(), reason=reason, dry_run=dry_run)
    if as_json:
        print_json(result)
        return
    render_report(cli.out, result.report)
    _print_result(cli, result, False)
    if dry_run and not result.would_succeed:
        raise typer.Exit(1)


@app.command("rollback")
def rollback_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    to: Annotated[Optional[int], typer.Option("--to", min=1, help="version to serve (default: the previous serving one)")] = None,
    deadline: Annotated[float, typer.Option("--deadline", min=1, help="seconds to wait for a restarted version to catch up")] = 900.0,
    actor: Actor = None,
    reason: Reason = None,
    as_json: AsJson = False,
) -> None:
    """Flip the alias back to the previous (or a named) version, restarting its job if needed."""
    from orchestrator.lifecycle.rollback import rollback

    cli = _cli(ctx)
    result = rollback(cli.kappa(), pipeline, to, actor=actor or default_actor(), reason=reason,
                      deadline_seconds=deadline)
    _print_result(cli, result, as_json)


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
    """Stop a version's job gracefully (keeps its table and checkpoint)."""
    from orchestrator.jobctl.control import stop_version

    cli = _cli(ctx)
    result = stop_version(cli.kappa(), pipeline, version, actor=actor or default_actor(), reason=reason, force=force)
    _print_result(cli, result, as_json)


@app.command("retire")
def retire_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    version: Annotated[int, typer.Argument(min=1, help="version to retire")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print what would be deleted; delete nothing")] = False,
    actor: Actor = None,
    reason: Reason = None,
    as_json: AsJson = False,
) -> None:
    """Stop a version's job and delete its table, checkpoint and consumer group."""
    from orchestrator.lifecycle.retire import retire

    cli = _cli(ctx)
    result = retire(cli.kappa(), pipeline, version, actor=actor or default_actor(), reason=reason, dry_run=dry_run)
    _print_result(cli, result, as_json)


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

    cli = _cli(ctx)
    result = apply_retention(cli.kappa(), pipeline, actor=actor or default_actor(), dry_run=not apply)
    _print_result(cli, result, as_json)


@app.command("reconcile")
def reconcile_cmd(ctx: typer.Context, actor: Actor = None, as_json: AsJson = False) -> None:
    """Repair what a crash left half done (alias published late, dead jobs not yet marked failed)."""
    from orchestrator.lifecycle.reconcile import reconcile

    cli = _cli(ctx)
    actions = reconcile(cli.kappa(), actor=actor or default_actor())
    if as_json:
        print_json({"actions": actions})
        return
    if not actions:
        cli.out.print("nothing to reconcile: the registry, the published aliases and the jobs agree")
        return
    for a in actions:
        d = _plain(a)
        where = f"{d.get('pipeline')}" + (f" v{d['version']}" if d.get("version") is not None else "")
        rest = {k: v for k, v in d.items() if k not in ("kind", "pipeline", "version")}
        cli.out.print(f"{d.get('kind', 'action')}: {where} {json.dumps(rest, ensure_ascii=False, default=str)}",
                      markup=False)


@app.command("monitor")
def monitor_cmd(ctx: typer.Context, actor: Actor = None, as_json: AsJson = False) -> None:
    """One monitoring pass: sample lag, detect failed jobs, reconcile, stop expired standbys."""
    from orchestrator.lifecycle.monitor import monitor

    cli = _cli(ctx)
    report = monitor(cli.kappa(), actor=actor or default_actor(), raise_on_problem=False)
    if as_json:
        print_json(report)
    else:
        d = _plain(report)
        for v in d.get("versions") or []:
            cli.out.print(json.dumps(v, ensure_ascii=False, default=str), markup=False)
        for key in ("reconciled", "stopped"):
            for item in d.get(key) or []:
                cli.out.print(f"{key}: {json.dumps(item, ensure_ascii=False, default=str)}", markup=False)
        for e in d.get("errors") or []:
            cli.err.print(f"error: {e}", markup=False)
        for p in d.get("problems") or []:
            cli.err.print(f"problem: {p}", markup=False)
    if report.problems:
        raise typer.Exit(1)


# -- history ------------------------------------------------------------------------------------

@app.command("history")
def history_cmd(
    ctx: typer.Context,
    pipeline: Annotated[Optional[str], typer.Argument(help="one pipeline (default: all)")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="newest entries to show")] = 50,
    as_json: AsJson = False,
) -> None:
    """The audit log: who did what, when, to which version, why, and the outcome."""
    cli = _cli(ctx)
    k = cli.kappa()
    if pipeline:
        k.pipeline(pipeline)
    entries = [_plain(e) for e in k.registry.audit_log(pipeline, limit=limit)]
    if as_json:
        print_json({"entries": entries})
        return
    if not entries:
        cli.out.print("the audit log is empty")
        return
    t = Table(title_justify="left")
    for col in ("at", "action", "pipeline", "version", "actor", "outcome", "reason"):
        t.add_column(col)
    for e in entries:
        t.add_row(_fmt_time(e.get("at") or e.get("created_at") or e.get("ts")), str(e.get("action")),
                  str(e.get("pipeline") or "-"), "-" if e.get("version") is None else f"v{e['version']}",
                  str(e.get("actor")), str(e.get("outcome")), str(e.get("reason") or ""))
    cli.out.print(t)


# -- lag plot -----------------------------------------------------------------------------------

@app.command("lag-plot")
def lag_plot_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    version: Annotated[Optional[list[int]], typer.Option("--version", min=1, help="a version to plot (repeatable; default: all)")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="PNG file (default: <home>/plots/<pipeline>-lag.png)")] = None,
) -> None:
    """Write a PNG of each version's lag over time (the catch-up curve) from the registry's samples."""
    from orchestrator.observe.lagplot import plot_pipeline_lag

    cli = _cli(ctx)
    k = cli.kappa()
    path = out or Path(cli.settings().home) / "plots" / f"{pipeline}-lag.png"
    written = plot_pipeline_lag(k, pipeline, path, versions=version or None)
    cli.out.print(f"wrote {written}")


# -- bench --------------------------------------------------------------------------------------

def _write_json(path: Path | None, data: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_plain(data), indent=2) + "\n")


# -- airflow ------------------------------------------------------------------------------------

@airflow_app.command("start")
def airflow_start(
    ctx: typer.Context,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="api-server port on 127.0.0.1 (0: a free one)")] = 0,
    db_url: Annotated[Optional[str], typer.Option("--db-url", envvar="KAPPA_AIRFLOW_DB_URL", help="PostgreSQL URL for Airflow's metadata (default: SQLite in <home>/airflow)")] = None,
    username: Annotated[str, typer.Option("--username", help="login to create")] = "admin",
    password: Annotated[str, typer.Option("--password", envvar="KAPPA_AIRFLOW_PASSWORD", help="its password")] = "admin",
    timeout: Annotated[float, typer.Option("--timeout", min=10, help="seconds to wait until every component is healthy")] = 300.0,
    as_json: AsJson = False,
) -> None:
    """Start Airflow for kappa in the background (stop it with `kappa airflow stop`)."""
    from orchestrator.airflow import stack as airflow_stack

    cli = _cli(ctx)
    settings = cli.settings()
    if not as_json:
        cli.out.print(f"starting Airflow for kappa home {settings.home} (db migrate, api-server, scheduler, "
                      f"dag-processor, triggerer); this takes a minute or two")
    stack = airflow_stack.start(settings, port or None, db_url=db_url, username=username, password=password,
                                timeout=timeout)
    stack.procs.clear()  # they outlive this command; `kappa airflow stop` ends them by PID
    if as_json:
        print_json({**stack.to_dict(), "already_running": stack.already_running})
        return
    verb = "already runs" if stack.already_running else "runs"
    cli.out.print(f"Airflow {verb} at {stack.url} (login {stack.username}); pids "
                  + ", ".join(f"{c} {pid}" for c, pid in stack.pids.items()))
    if not settings.bootstrap_servers:
        cli.err.print("warning: no Kafka bootstrap servers are configured, so DAG runs cannot reach a broker; "
                      "start one with `kappa broker start` (before `kappa airflow start`) or set "
                      "KAPPA_BOOTSTRAP_SERVERS")
    cli.out.print(f"logs in {stack.log_dir}; trigger a reprocess with `kappa trigger reprocess <pipeline> --rules v2`")


@airflow_app.command("stop")
def airflow_stop(ctx: typer.Context) -> None:
    """Stop the Airflow that `kappa airflow start` started for this kappa home, by its PIDs."""
    from orchestrator.airflow import stack as airflow_stack

    cli = _cli(ctx)
    stopped = airflow_stack.stop(cli.settings())
    if stopped:
        cli.out.print(f"stopped Airflow: {', '.join(stopped)}")
    else:
        cli.out.print("no Airflow runs for this kappa home")


@airflow_app.command("status")
def airflow_status(ctx: typer.Context, as_json: AsJson = False) -> None:
    """Whether Airflow runs for this kappa home, where, and which components are alive."""
    from orchestrator.airflow import stack as airflow_stack

    cli = _cli(ctx)
    stack = airflow_stack.running(cli.settings())
    if as_json:
        print_json({"running": stack is not None, **(stack.to_dict() if stack else {}),
                    "alive": stack.alive() if stack else {}})
        return
    if stack is None:
        cli.out.print("no Airflow runs for this kappa home; start it with `kappa airflow start`")
        return
    cli.out.print(f"Airflow runs at {stack.url} (login {stack.username}):")
    for comp, alive in stack.alive().items():
        cli.out.print(f"  {comp}: {'alive' if alive else 'GONE'} (pid {stack.pids[comp]}, log {stack.log_path(comp)})")


# -- trigger ------------------------------------------------------------------------------------

AirflowUrl = Annotated[Optional[str], typer.Option("--airflow-url", envvar="KAPPA_AIRFLOW_URL", help="Airflow base URL (default: the one `kappa airflow start` runs)")]
AirflowUser = Annotated[Optional[str], typer.Option("--airflow-user", envvar="KAPPA_AIRFLOW_USER", help="Airflow login (default: admin, or the running stack's)")]
AirflowPassword = Annotated[Optional[str], typer.Option("--airflow-password", envvar="KAPPA_AIRFLOW_PASSWORD", help="its password (default: admin, or the running stack's)")]
FollowTimeout = Annotated[float, typer.Option("--timeout", min=1, help="seconds to follow the run before giving up")]


def _airflow_target(cli: Cli, url: str | None, user: str | None, password: str | None) -> tuple[str, str, str]:
    from orchestrator.core.exceptions import AirflowError

    stack = None
    if url is None or password is None or user is None:
        from orchestrator.airflow import stack as airflow_stack

        try:
            stack = airflow_stack.running(cli.settings())
        except KappaError:
            stack = None
    if url is None:
        if stack is None:
            raise AirflowError("no Airflow URL: start Airflow with `kappa airflow start`, or pass --airflow-url "
                               "(or set KAPPA_AIRFLOW_URL)")
        url = stack.url
    if user is None:
        user = stack.username if stack is not None else "admin"
    if password is None:
        password = stack.password if stack is not None and stack.password else "admin"
    return url, user, password


def _follow(cli: Cli, dag_id: str, conf: dict[str, Any], url, user, password, timeout: float, as_json: bool,
            actor: str | None) -> None:
    from orchestrator.airflow.client import trigger_and_follow

    url, user, password = _airflow_target(cli, url, user, password)
    if not as_json:
        cli.out.print(f"triggering {dag_id} at {url} as {user} with conf {json.dumps(conf)}", markup=False)

    def on_state(run_state: str, tasks: dict[str, Any]) -> None:
        if not as_json:
            shown = ", ".join(f"{t}={s or 'none'}" for t, s in tasks.items())
            cli.out.print(f"  run {run_state}: {shown}", markup=False)

    note = f"triggered by {actor or default_actor()} with `kappa trigger`"
    outcome = trigger_and_follow(url, user, password, dag_id, conf, timeout=timeout, on_state=on_state, note=note)
    if as_json:
        print_json(outcome)
    else:
        cli.out.print(f"{dag_id} run {outcome.run_id}: {outcome.state} ({outcome.url})", markup=False)
        for task_id, value in outcome.xcom.items():
            msg = value.get("message") if isinstance(value, dict) else None
            if msg:
                cli.out.print(f"  {task_id}: {msg}", markup=False)
    outcome.raise_for_state()


def _trigger_reason(reason: str | None, actor: str | None) -> str:
    """The DAGs require a reason of at least 3 characters; say who asked when none was given."""
    return reason or f"requested by {actor or default_actor()} with kappa trigger"


@trigger_app.command("reprocess")
def trigger_reprocess(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    rules: Annotated[Optional[str], typer.Option("--rules", help="rules version (default: the newest)")] = None,
    threshold: Annotated[Optional[int], typer.Option("--threshold", min=0, help="catch-up threshold in records")] = None,
    auto_promote: Annotated[bool, typer.Option("--auto-promote/--no-auto-promote", help="promote when ready")] = True,
    grace: Annotated[Optional[int], typer.Option("--grace", min=0, help="standby grace period in seconds")] = None,
    deadline_minutes: Annotated[Optional[int], typer.Option("--deadline-minutes", min=1, help="catch-up deadline")] = None,
    reason: Reason = None,
    actor: Actor = None,
    airflow_url: AirflowUrl = None,
    airflow_user: AirflowUser = None,
    airflow_password: AirflowPassword = None,
    timeout: FollowTimeout = 3600.0,
    as_json: AsJson = False,
) -> None:
    """Trigger the kappa_reprocess DAG (deploy, wait until ready, report, promote) and follow it."""
    from orchestrator.airflow.client import reprocess_conf

    conf = reprocess_conf(pipeline, rules, reason=_trigger_reason(reason, actor), threshold=threshold,
                          auto_promote=auto_promote, grace_period_seconds=grace,
                          catchup_deadline_minutes=deadline_minutes)
    _follow(_cli(ctx), "kappa_reprocess", conf, airflow_url, airflow_user, airflow_password, timeout, as_json, actor)


@trigger_app.command("promote")
def trigger_promote(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    version: Annotated[Optional[int], typer.Argument(min=1, help="version (default: the DAG's choice)")] = None,
    grace: Annotated[Optional[int], typer.Option("--grace", min=0, help="standby grace period in seconds")] = None,
    reason: Reason = None,
    actor: Actor = None,
    airflow_url: AirflowUrl = None,
    airflow_user: AirflowUser = None,
    airflow_password: AirflowPassword = None,
    timeout: FollowTimeout = 3600.0,
    as_json: AsJson = False,
) -> None:
    """Trigger the kappa_promote DAG and follow it."""
    from orchestrator.airflow.client import promote_conf

    conf = promote_conf(pipeline, version, reason=_trigger_reason(reason, actor), grace_period_seconds=grace)
    _follow(_cli(ctx), "kappa_promote", conf, airflow_url, airflow_user, airflow_password, timeout, as_json, actor)


@trigger_app.command("rollback")
def trigger_rollback(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    to: Annotated[Optional[int], typer.Option("--to", min=1, help="version to serve (default: the previous one)")] = None,
    deadline_minutes: Annotated[Optional[int], typer.Option("--deadline-minutes", min=1, help="catch-up deadline")] = None,
    reason: Reason = None,
    actor: Actor = None,
    airflow_url: AirflowUrl = None,
    airflow_user: AirflowUser = None,
    airflow_password: AirflowPassword = None,
    timeout: FollowTimeout = 3600.0,
    as_json: AsJson = False,
) -> None:
    """Trigger the kappa_rollback DAG and follow it."""
    from orchestrator.airflow.client import rollback_conf

    conf = rollback_conf(pipeline, to, reason=_trigger_reason(reason, actor), catchup_deadline_minutes=deadline_minutes)
    _follow(_cli(ctx), "kappa_rollback", conf, airflow_url, airflow_user, airflow_password, timeout, as_json, actor)


@bench_app.command("reprocess")
def bench_reprocess(
    ctx: typer.Context,
    records: Annotated[int, typer.Option("--records", min=1, help="records to produce")] = 2_000_000,
    keys: Annotated[int, typer.Option("--keys", min=1, help="distinct keys")] = 500_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="topic partitions")] = 4,
    value_size: Annotated[int, typer.Option("--value-size", min=50, help="bytes per value, about")] = 200,
    max_records_per_batch: Annotated[int, typer.Option("--max-records-per-batch", min=1, help="micro-batch cap (the standardize pipeline's)")] = 500_000,
    rules: Annotated[str, typer.Option("--rules", help="rules version of the titles ruleset")] = "v2",
    malformed_share: Annotated[float, typer.Option("--malformed-share", min=0.0, max=1.0, help="share of malformed records")] = 0.0,
    use_configured_broker: Annotated[bool, typer.Option("--use-configured-broker", help="produce to the configured bootstrap servers instead of a fresh embedded broker")] = False,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="compare the output with the expected table")] = True,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="also write the figures as JSON here")] = None,
) -> None:
    """Full standardize reprocess from offset zero against a raw consumer: records/s, MB/s, start-up, memory."""
    from orchestrator.dev.bench import run_reprocess_bench

    cli = _cli(ctx)
    settings = cli.settings()
    bootstrap = kafka_config = None
    if use_configured_broker:
        k = cli.kappa()
        bootstrap, kafka_config = k.bootstrap_servers, k.settings.kafka_client_config()
        kafka_config.pop("bootstrap.servers", None)
    run_reprocess_bench(records, keys, partitions, value_size, out, max_records_per_batch=max_records_per_batch,
                        rules_version=rules, malformed_share=malformed_share, bootstrap=bootstrap,
                        kafka_config=kafka_config or None, master=settings.spark_master, verify=verify,
                        console=cli.out)
    if out is not None:
        cli.out.print(f"wrote {out}")


@bench_app.command("deploy")
def bench_deploy(
    ctx: typer.Context,
    records: Annotated[int, typer.Option("--records", min=1, help="records in the log")] = 2_000_000,
    keys: Annotated[int, typer.Option("--keys", min=1, help="distinct keys")] = 500_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="topic partitions")] = 4,
    value_size: Annotated[int, typer.Option("--value-size", min=50, help="bytes per value, about")] = 200,
    rules: Annotated[str, typer.Option("--rules", help="rules version")] = "v2",
    poll: Annotated[float, typer.Option("--poll", min=0.1, help="seconds between lag samples")] = 0.5,
    deadline: Annotated[float, typer.Option("--deadline", min=1, help="seconds to wait for catch-up at most")] = 3600.0,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="also write the figures as JSON here")] = None,
    as_json: AsJson = False,
) -> None:
    """Time from `deploy` to a finished `promote` over a fresh log (Spark start-up included), by phase.

    Runs on its own embedded broker in a temporary home, and stops everything it started.
    """
    from orchestrator.dev.demo import run_deploy_bench

    cli = _cli(ctx)
    figures = run_deploy_bench(records, keys, partitions=partitions, value_size=value_size, rules=rules, poll=poll,
                               deadline=deadline, console=cli.err if as_json else cli.out, overrides=cli.overrides)
    _write_json(out, figures)
    if as_json:
        print_json(figures)
    elif out is not None:
        cli.out.print(f"wrote {out}")


@bench_app.command("flip")
def bench_flip(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline whose alias to flip")] = "standardize",
    flips: Annotated[int, typer.Option("--flips", min=1, help="flips to time")] = 100,
    readers: Annotated[int, typer.Option("--readers", min=0, help="concurrent readers resolving the alias and reading the table")] = 4,
    reader_mode: Annotated[str, typer.Option("--reader-mode", help="readers as 'process'es or 'thread's")] = "process",
    versions: Annotated[Optional[str], typer.Option("--versions", help="the two versions to flip between, e.g. 1,2 (default: serving and previous)")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="also write the figures as JSON here")] = None,
    as_json: AsJson = False,
) -> None:
    """Flip latency (registry CAS + pointer publish) under concurrent readers; p50, p99, reader errors.

    Needs a pipeline whose alias has served two versions with tables, e.g. the demo's home:
    `kappa --home <demo home> bench flip`. The alias ends where it started.
    """
    from orchestrator.dev.flipbench import flip_benchmark

    cli = _cli(ctx)
    pair = None
    if versions is not None:
        try:
            a, b = (int(x) for x in versions.split(","))
        except ValueError:
            raise typer.BadParameter("expected two version numbers, e.g. 1,2", param_hint="--versions") from None
        pair = (a, b)
    if not as_json:
        kind = "processes" if reader_mode == "process" else "threads"
        cli.out.print(f"flipping {pipeline}'s alias {flips} times under {readers} reader {kind}...")
    figures = flip_benchmark(cli.kappa(), pipeline, versions=pair, flips=flips, readers=readers,
                             reader_mode=reader_mode, actor=default_actor())
    _write_json(out, figures)
    if as_json:
        print_json(figures)
        return
    cli.out.print(f"flip latency over {figures.get('flips')} flips: p50 {figures.get('p50_ms')} ms, "
                  f"p99 {figures.get('p99_ms')} ms; reader errors: {figures.get('reader_errors')}")
    rest = {k: v for k, v in figures.items() if k not in ("p50_ms", "p99_ms", "reader_errors", "flips")}
    cli.out.print(json.dumps(_plain(rest), indent=2, ensure_ascii=False), markup=False)
    if out is not None:
        cli.out.print(f"wrote {out}")


# -- broker -------------------------------------------------------------------------------------

def broker_file(home: Path | str) -> Path:
    return Path(home) / BROKER_FILE


def _process_matches(pid: int, created: float | None) -> bool:
    import psutil

    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return created is None or abs(p.create_time() - created) < 0.5
    except psutil.Error:
        return False


def read_broker_file(home: Path | str) -> dict[str, Any] | None:
    """The background broker recorded under `home`, if its process still runs (else None)."""
    path = broker_file(home)
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(data, dict) or not _process_matches(int(data.get("pid", 0)), data.get("created")):
        return None
    return data


def write_broker_file(home: Path | str, pid: int, port: int, log: Path | None = None, *,
                      owner: str = "kappa broker start") -> dict[str, Any]:
    import psutil

    from orchestrator.serving import write_pointer

    data = {"pid": pid, "port": port, "bootstrap_servers": f"127.0.0.1:{port}",
            "created": psutil.Process(pid).create_time(), "log": str(log) if log else None,
            "started_at": time.time(), "owner": owner}
    write_pointer(broker_file(home), data)
    return data


def stop_pid(pid: int, created: float | None, timeout: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL, the process `pid` if it is still the one recorded. True if it ran."""
    import psutil

    if not _process_matches(pid, created):
        return False
    try:
        p = psutil.Process(pid)
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except psutil.TimeoutExpired:
            p.kill()
            p.wait(timeout)
    except psutil.NoSuchProcess:
        pass
    return True


@broker_app.command("start")
def broker_start(
    ctx: typer.Context,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="port on 127.0.0.1 (0: a free one)")] = 0,
    as_json: AsJson = False,
) -> None:
    """Start the embedded broker in the background; later commands find it through the kappa home."""
    from orchestrator.dev.broker import EmbeddedBroker

    cli = _cli(ctx)
    home = Path(cli.settings().home)
    running = read_broker_file(home)
    if running is not None:
        msg = f"the embedded broker already runs at {running['bootstrap_servers']} (pid {running['pid']})"
        if as_json:
            print_json({**running, "started": False, "message": msg})
        else:
            cli.out.print(msg)
        return
    home.mkdir(parents=True, exist_ok=True)
    log = home / "broker.log"
    broker = EmbeddedBroker(port=port, log_path=log).start()
    data = write_broker_file(home, broker.proc.pid, broker.port, log)
    broker.proc = None  # it outlives this command; `kappa broker stop` ends it by PID
    msg = (f"the embedded broker runs at {data['bootstrap_servers']} (pid {data['pid']}, memory only, log {log}); "
           f"stop it with `kappa broker stop`")
    if as_json:
        print_json({**data, "started": True, "message": msg})
    else:
        cli.out.print(msg)


@broker_app.command("stop")
def broker_stop(ctx: typer.Context) -> None:
    """Stop the background broker recorded under the kappa home, by its PID."""
    cli = _cli(ctx)
    home = Path(cli.settings().home)
    path = broker_file(home)
    data = read_broker_file(home)
    if data is None:
        path.unlink(missing_ok=True)
        cli.out.print(f"no embedded broker runs for {home}")
        return
    stop_pid(int(data["pid"]), data.get("created"))
    path.unlink(missing_ok=True)
    cli.out.print(f"stopped the embedded broker at {data['bootstrap_servers']} (pid {data['pid']}); "
                  f"it kept everything in memory, so its topics are gone")


@broker_app.command("status")
def broker_status(ctx: typer.Context, as_json: AsJson = False) -> None:
    """Whether the background broker runs, and where."""
    cli = _cli(ctx)
    data = read_broker_file(cli.settings().home)
    if as_json:
        print_json({"running": data is not None, **(data or {})})
    elif data is None:
        cli.out.print("no embedded broker runs for this kappa home; start one with `kappa broker start`")
    else:
        cli.out.print(f"the embedded broker runs at {data['bootstrap_servers']} (pid {data['pid']})")


# -- demo ---------------------------------------------------------------------------------------

@app.command("demo")
def demo_cmd(
    ctx: typer.Context,
    home: Annotated[Optional[Path], typer.Option("--home", help="kappa home for the demo (default: a fresh temporary directory)")] = None,
    records: Annotated[int, typer.Option("--records", min=1000, help="records in the topic before v1 is deployed")] = 200_000,
    keys: Annotated[int, typer.Option("--keys", min=100, help="distinct members")] = 50_000,
    rate: Annotated[float, typer.Option("--rate", min=1, help="live updates per second while the demo runs")] = 50.0,
    threshold: Annotated[Optional[int], typer.Option("--threshold", min=0, help="catch-up threshold in records (default: the pipeline's catchup_threshold)")] = None,
    clean: Annotated[bool, typer.Option("--clean", help="delete the demo's home afterwards (default: keep it to explore)")] = False,
    batch: Annotated[int, typer.Option("--batch", min=100, help="records per micro-batch (small: lag visibly goes down)")] = 25_000,
) -> None:
    """From nothing: broker, topic, live updates, deploy v1, v2 with new rules, promote, roll back and forward."""
    from orchestrator.dev.demo import DemoOptions, run_demo

    cli = _cli(ctx)
    opts = DemoOptions(home=home, records=records, keys=keys, rate=rate, threshold=threshold, clean=clean,
                       batch=batch)
    run_demo(opts, console=cli.out, overrides=cli.overrides, config_file=cli.config_file)


def main() -> None:
    """Console script entry point (`kappa`)."""
    app(prog_name="kappa")


if __name__ == "__main__":
    main()
