"""`kappa`, the command line: one module per command group over the control plane's verbs.

`app` holds the global options and the shared `Cli` state; `render` what the commands print.
Importing the package registers every command group on `app`.
"""

from __future__ import annotations

from orchestrator.cli.app import app
# in the order `kappa --help` lists them; importing a group registers its commands
from orchestrator.cli import status, terminal, lifecycle, throttle, supervise, metrics, bench, airflow, trigger, broker, demo, project, rules  # noqa: F401, I001

__all__ = ["app", "main"]


def main() -> None:
    """Console script entry point (`kappa`)."""
    app(prog_name="kappa")
