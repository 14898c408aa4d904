"""`kappa init DIR`: a new project of the team's own (`orchestrator.dev.project`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.app import app, cli_of

__all__ = ["init_cmd"]


@app.command("init")
def init_cmd(
    ctx: typer.Context,
    folder: Annotated[Path, typer.Argument(help="the new project's folder (created if missing; must hold none of its files)")],
) -> None:
    """Write a working project: settings, a pipelines file, a ruleset, a job of the contract and its test."""
    from orchestrator.dev.project import write_project

    out = cli_of(ctx).out
    root = folder.expanduser().resolve()
    for path in write_project(root):
        out.print(f"wrote {path}", highlight=False, soft_wrap=True)
    out.print(f"\nNext, in {root}:\n"
              f"  pytest tests                       # the job on a few records, no Kafka\n"
              f"  kappa broker start                 # the embedded broker, then produce to member_profiles\n"
              f"  kappa deploy profiles --rules v1 --wait   # kappa reads .kappa/kappa.toml there\n"
              f"  kappa promote profiles 1", highlight=False, soft_wrap=True)
