"""`kappa demo`: the whole lifecycle from nothing, told section by section (`orchestrator.dev.demo`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from orchestrator.cli.app import app, cli_of

__all__ = ["demo_cmd"]


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
