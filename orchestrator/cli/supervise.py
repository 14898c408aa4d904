"""`kappa supervise`: the embedded default's supervisor, without Airflow.

Runs `orchestrator.lifecycle.monitor.monitor` passes every ``--interval`` seconds in the foreground
until Ctrl-C (or SIGTERM): each pass reconciles (which restarts dead jobs from their checkpoints,
with backoff and a bound: `orchestrator.lifecycle.supervise`), samples lag, and stops standbys past
their grace period. It prints one line per action and per problem, and never dies on a pass's
error (the registry or the broker away for a while): the error is printed and the next pass runs.

Who supervises in each setup: this command in the embedded default (no Airflow); Airflow's
``kappa_monitor`` DAG (one pass a minute) when Airflow runs; a cluster manager's own restart
policy (Kubernetes, YARN, Spark standalone with ``--supervise``) restarts a driver process it
launched, and the monitor then still restarts what dies outside it. Run exactly one supervisor per
registry, or several: a restart takes the version's lease, so two never start the same job.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from datetime import datetime, timezone
from typing import Annotated, Any, Optional

import typer

from orchestrator.cli.app import Actor, app, cli_of, default_actor

__all__ = ["supervise_cmd", "action_line", "now_stamp", "run_passes"]


def watch_line(a: dict) -> str:
    """One line per watch decision of a pass (samples are in `kappa status`)."""
    kind, where = a.get("kind"), f"{a.get('pipeline')} v{a.get('version')}"
    if kind == "rolled_back":
        return (f"{now_stamp()} watch {where}: rolled back automatically to v{a.get('to_version')}: {a.get('cause')}"
                + (f"; v{a.get('version')} {a['degraded']}" if a.get("degraded") else ""))
    if kind == "passed":
        return f"{now_stamp()} watch {where}: passed its grace period, healthy"
    detail = a.get("error") or a.get("reason") or a.get("cause") or ""
    return f"{now_stamp()} watch {where}: {kind} {detail}".rstrip()


def now_stamp() -> str:
    """The current time (UTC) at the head of a supervision line: '2025-05-01T12:05:01Z'."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def action_line(a: dict[str, Any]) -> str:
    """One line for one action of a pass: when, what, which version, and the rest as JSON."""
    where = str(a.get("pipeline") or a.get("alias") or "")
    if a.get("version") is not None:
        where += f" v{a['version']}"
    rest = {k: v for k, v in a.items() if k not in ("kind", "pipeline", "version") and v is not None}
    return f"{now_stamp()} {a.get('kind', 'action')} {where} {json.dumps(rest, default=str, ensure_ascii=False)}"


def run_passes(k_of, *, actor: str, interval: float, passes: int | None, out, err,
               stop: threading.Event, pipelines: list[str] | None = None, on_report=None) -> int:
    """Run monitor passes until `stop` is set or `passes` ran; returns how many passes failed.

    `on_report(report)` is called after each pass (None for a pass that failed), e.g. to keep
    metrics (`kappa metrics serve`)."""
    from orchestrator.lifecycle.monitor import monitor

    failed = n = 0
    while not stop.is_set() and (passes is None or n < passes):
        n += 1
        try:
            report = monitor(k_of(), actor=actor, pipelines=pipelines or None, raise_on_problem=False)
            if on_report is not None:
                on_report(report)
            for a in report.reconciled:
                out(action_line(a))
            for s in report.stopped:
                out(action_line({"kind": "stop_standby", **s}))
            for t in report.throttled:
                out(action_line(t))
            for w in report.watched:
                if w.get("kind") != "sampled":
                    out(watch_line(w))
            for e in report.errors:
                err(f"{now_stamp()} error {e}")
            for p in report.problems:
                err(f"{now_stamp()} problem {p}")
        except Exception as e:  # noqa: BLE001 - a supervisor outlives any one pass
            failed += 1
            if on_report is not None:
                on_report(None)
            text = " ".join(str(e).split()) or type(e).__name__
            err(f"{now_stamp()} error pass {n} failed ({type(e).__name__}): {text}; next pass in {interval:g} s")
        if passes is not None and n >= passes:
            break
        stop.wait(interval)
    return failed


@app.command("supervise")
def supervise_cmd(
    ctx: typer.Context,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="seconds between two passes")] = 15.0,
    passes: Annotated[Optional[int], typer.Option("--passes", min=1, help="stop after this many passes "
                                                                            "(default: until Ctrl-C)")] = None,
    pipeline: Annotated[Optional[list[str]], typer.Option("--pipeline", metavar="NAME", help="supervise only this pipeline "
                                                                              "(repeatable; default: all)")] = None,
    actor: Actor = None,
) -> None:
    """Keep every version's job running: monitor passes every --interval s until Ctrl-C (restarts
    dead jobs from their checkpoints, with backoff and a bound; stops expired standbys)."""
    cli = cli_of(ctx)
    who = actor or f"supervise:{default_actor()}"
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread (tests)
            pass
    cli.out.print(f"{now_stamp()} supervising {', '.join(pipeline) if pipeline else 'every pipeline'} every "
                  f"{interval:g} s as {who}; Ctrl-C stops", markup=False)
    started = time.monotonic()
    try:
        failed = run_passes(cli.kappa, actor=who, interval=interval, passes=passes, stop=stop, pipelines=pipeline,
                            out=lambda s: cli.out.print(s, markup=False, soft_wrap=True),
                            err=lambda s: cli.err.print(s, markup=False, soft_wrap=True))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    cli.out.print(f"{now_stamp()} supervisor stopped after {time.monotonic() - started:.0f} s"
                  + (f" ({failed} passes failed)" if failed else ""), markup=False)
