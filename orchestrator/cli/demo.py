"""`kappa demo`: the whole lifecycle from nothing, told section by section (`orchestrator.dev.demo`);
`kappa up`: the same embedded stack with v1 serving and Airflow on top, until Ctrl-C (`orchestrator.dev.up`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from orchestrator.cli.app import app, cli_of

__all__ = ["demo_cmd", "up_cmd"]


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

    cli = cli_of(ctx)
    opts = DemoOptions(home=home, records=records, keys=keys, rate=rate, threshold=threshold, clean=clean,
                       batch=batch)
    run_demo(opts, console=cli.out, overrides=cli.overrides, config_file=cli.config_file)


@app.command("up")
def up_cmd(
    ctx: typer.Context,
    home: Annotated[Optional[Path], typer.Option("--home", help="kappa home (default: a fresh temporary directory)")] = None,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Airflow UI port on 127.0.0.1 (0: a free one)")] = 0,
    records: Annotated[int, typer.Option("--records", min=1000, help="records in the topic before v1 is deployed")] = 20_000,
    keys: Annotated[int, typer.Option("--keys", min=100, help="distinct members")] = 5_000,
    rate: Annotated[float, typer.Option("--rate", min=1, help="live updates per second while it runs")] = 5.0,
) -> None:
    """Everything to click through kappa in the Airflow UI: broker, data, v1 serving, Airflow; until Ctrl-C.

    Prints the UI's URL and login (admin / admin). Ctrl-C stops everything it started, by PID.
    """
    from orchestrator.dev.up import UpOptions, run_up

    cli = cli_of(ctx)
    code = run_up(UpOptions(home=home, port=port, records=records, keys=keys, rate=rate), console=cli.out,
                  overrides=cli.overrides)
    if code:
        raise typer.Exit(code)
