"""`kappa metrics serve|show`: lag, readiness, flips, rejects and restarts for monitoring systems.

`serve` is `kappa supervise` with a Prometheus endpoint: it runs monitor passes every
``--interval`` seconds (reconcile, restart dead jobs, sample lag, stop expired standbys) and
serves `GET /metrics` in the Prometheus text format on 127.0.0.1 (``--host`` to bind elsewhere,
on purpose). Each scrape reads the registry afresh; readiness is the latest pass's decision. With
`opentelemetry-sdk` installed (it comes with Airflow) the same figures are observable instruments
on an OpenTelemetry MeterProvider, exported over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
``--no-monitor`` serves the registry's figures without running passes (when `kappa supervise` or
Airflow's kappa_monitor already runs them). `show` prints the page once. See
`orchestrator.observe.metrics` for the metrics and their labels.
"""

from __future__ import annotations

import signal
import threading
from typing import Annotated, Optional

import typer

from orchestrator.cli.app import Actor, app, cli_of, default_actor, new_typer
from orchestrator.core.exceptions import ConfigError

__all__ = ["metrics_app"]

metrics_app = new_typer(help="Metrics for Prometheus and OpenTelemetry: lag (records, seconds), readiness, "
                             "flips, rejects, job restarts.")
app.add_typer(metrics_app, name="metrics")

Pipelines = Annotated[Optional[list[str]], typer.Option("--pipeline", metavar="NAME",
                                                        help="only this pipeline (repeatable; default: all)")]


def run_monitor_passes(hub, k_of, *, actor: str, interval: float, passes: int | None, stop: threading.Event,
                       out, err, pipelines: list[str] | None = None) -> int:
    """Monitor passes into `hub` until `stop` or `passes` ran, printing like `kappa supervise`; failed passes."""
    from orchestrator.cli.supervise import run_passes

    return run_passes(k_of, actor=actor, interval=interval, passes=passes, out=out, err=err, stop=stop,
                      pipelines=pipelines, on_report=hub.record_pass)


@metrics_app.command("serve")
def serve_cmd(
    ctx: typer.Context,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="port of the /metrics endpoint (0: a free one)")] = 9464,
    host: Annotated[str, typer.Option("--host", help="address to bind (default loopback only)")] = "127.0.0.1",
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="seconds between two monitor passes")] = 15.0,
    passes: Annotated[Optional[int], typer.Option("--passes", min=1, help="stop after this many passes (default: until Ctrl-C)")] = None,
    monitor: Annotated[bool, typer.Option("--monitor/--no-monitor", help="run monitor passes (as `kappa supervise`)")] = True,
    pipeline: Pipelines = None,
    actor: Actor = None,
) -> None:
    """Serve /metrics (Prometheus text format) while running monitor passes every --interval s, until Ctrl-C."""
    from orchestrator.cli.supervise import now_stamp
    from orchestrator.observe.metrics import MetricsHub, MetricsServer
    from orchestrator.observe.otel import start_otel

    cli = cli_of(ctx)
    k = cli.kappa()
    for name in pipeline or []:
        k.pipeline(name)
    hub = MetricsHub(cli.kappa, pipeline, min_age=1.0)
    try:
        server = MetricsServer(hub, host, port).start()
    except OSError as e:
        raise ConfigError(f"cannot serve metrics on {host}:{port} ({e.strerror}); choose another --port") from None
    provider = start_otel(hub)
    stop = threading.Event()
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, lambda signum, frame: stop.set())
        except ValueError:  # not the main thread (tests)
            pass
    who = actor or f"metrics:{default_actor()}"
    cli.out.print(f"{now_stamp()} serving metrics at {server.url}"
                  + (f"; monitor passes every {interval:g} s as {who}" if monitor else "")
                  + ("; OpenTelemetry export on" if provider is not None else "") + "; Ctrl-C stops", markup=False)
    try:
        if monitor:
            run_monitor_passes(hub, cli.kappa, actor=who, interval=interval, passes=passes, stop=stop,
                               pipelines=pipeline, out=lambda s: cli.out.print(s, markup=False, soft_wrap=True),
                               err=lambda s: cli.err.print(s, markup=False, soft_wrap=True))
        elif passes is None:
            stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.stop()
        if provider is not None:
            provider.shutdown()
    cli.out.print(f"{now_stamp()} metrics server stopped", markup=False)


@metrics_app.command("show")
def show_cmd(ctx: typer.Context, pipeline: Pipelines = None) -> None:
    """Print the metrics page once (no monitor pass: readiness figures are left out)."""
    from orchestrator.observe.metrics import collect, render_text

    cli = cli_of(ctx)
    k = cli.kappa()
    for name in pipeline or []:
        k.pipeline(name)
    typer.echo(render_text(collect(k, pipelines=pipeline or None)), nl=False)
