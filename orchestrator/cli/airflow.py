"""`kappa airflow start|stop|status`: a local Airflow for kappa, in the background of a kappa home."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from orchestrator.cli.app import AsJson, app, cli_of, new_typer
from orchestrator.cli.render import print_json
from orchestrator.core.envvars import KAPPA_AIRFLOW_DB_URL, KAPPA_AIRFLOW_PASSWORD, KAPPA_BOOTSTRAP_SERVERS

__all__ = ["airflow_app"]

airflow_app = new_typer(help="Run Airflow for kappa on this machine (api-server, scheduler, dag-processor, triggerer).")
app.add_typer(airflow_app, name="airflow")


@airflow_app.command("start")
def airflow_start(
    ctx: typer.Context,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="api-server port on 127.0.0.1 (0: a free one)")] = 0,
    db_url: Annotated[Optional[str], typer.Option("--db-url", envvar=KAPPA_AIRFLOW_DB_URL, help="PostgreSQL URL for Airflow's metadata (default: SQLite in <home>/airflow)")] = None,
    username: Annotated[str, typer.Option("--username", help="login to create")] = "admin",
    password: Annotated[str, typer.Option("--password", envvar=KAPPA_AIRFLOW_PASSWORD, help="its password")] = "admin",
    timeout: Annotated[float, typer.Option("--timeout", min=10, help="seconds to wait until every component is healthy")] = 300.0,
    as_json: AsJson = False,
) -> None:
    """Start Airflow for kappa in the background (stop it with `kappa airflow stop`)."""
    from orchestrator.airflow import stack as airflow_stack

    cli = cli_of(ctx)
    settings = cli.settings()
    if not as_json:
        cli.out.print(f"starting Airflow for kappa home {settings.home} (db migrate, api-server, scheduler, "
                      f"dag-processor, triggerer); this takes a minute or two")
    stack = airflow_stack.start(settings, port or None, db_url=db_url, username=username, password=password,
                                timeout=timeout)
    stack.procs.clear()  # they outlive this command; `kappa airflow stop` ends them by PID
    if as_json:
        print_json({**stack.model_dump(mode="json"), "already_running": stack.already_running})
        return
    verb = "already runs" if stack.already_running else "runs"
    cli.out.print(f"Airflow {verb} at {stack.url} (login {stack.username}); pids "
                  + ", ".join(f"{c} {pid}" for c, pid in stack.pids.items()))
    if not settings.bootstrap_servers:
        cli.err.print("warning: no Kafka bootstrap servers are configured, so DAG runs cannot reach a broker; "
                      "start one with `kappa broker start` (before `kappa airflow start`) or set "
                      f"{KAPPA_BOOTSTRAP_SERVERS}")
    cli.out.print(f"logs in {stack.log_dir}; trigger a reprocess with `kappa trigger reprocess <pipeline> --rules v2`")


@airflow_app.command("stop")
def airflow_stop(ctx: typer.Context) -> None:
    """Stop the Airflow that `kappa airflow start` started for this kappa home, by its PIDs."""
    from orchestrator.airflow import stack as airflow_stack

    cli = cli_of(ctx)
    stopped = airflow_stack.stop(cli.settings())
    if stopped:
        cli.out.print(f"stopped Airflow: {', '.join(stopped)}")
    else:
        cli.out.print("no Airflow runs for this kappa home")


@airflow_app.command("status")
def airflow_status(ctx: typer.Context, as_json: AsJson = False) -> None:
    """Whether Airflow runs for this kappa home, where, and which components are alive."""
    from orchestrator.airflow import stack as airflow_stack

    cli = cli_of(ctx)
    stack = airflow_stack.running(cli.settings())
    if as_json:
        print_json({"running": stack is not None, **(stack.model_dump(mode="json") if stack else {}),
                    "alive": stack.alive() if stack else {}})
        return
    if stack is None:
        cli.out.print("no Airflow runs for this kappa home; start it with `kappa airflow start`")
        return
    cli.out.print(f"Airflow runs at {stack.url} (login {stack.username}):")
    for comp, alive in stack.alive().items():
        cli.out.print(f"  {comp}: {'alive' if alive else 'GONE'} (pid {stack.pids[comp]}, log {stack.log_path(comp)})")
