"""`kappa trigger reprocess|promote|rollback`: run kappa's DAGs through Airflow's REST API and follow them.

The conf holds only what was given; everything else takes the DAG's defaults, so a triggered
run and a run started from Airflow's form behave the same.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer

from orchestrator.cli.app import Actor, AsJson, Cli, Reason, app, cli_of, default_actor, new_typer
from orchestrator.cli.render import print_json
from orchestrator.core.envvars import KAPPA_AIRFLOW_PASSWORD, KAPPA_AIRFLOW_URL, KAPPA_AIRFLOW_USER
from orchestrator.core.exceptions import AirflowError, KappaError

__all__ = ["trigger_app"]

trigger_app = new_typer(help="Trigger kappa's Airflow DAGs through Airflow's REST API and follow the run.")
app.add_typer(trigger_app, name="trigger")


AirflowUrl = Annotated[Optional[str], typer.Option("--airflow-url", envvar=KAPPA_AIRFLOW_URL, help="Airflow base URL (default: the one `kappa airflow start` runs)")]
AirflowUser = Annotated[Optional[str], typer.Option("--airflow-user", envvar=KAPPA_AIRFLOW_USER, help="Airflow login (default: admin, or the running stack's)")]
AirflowPassword = Annotated[Optional[str], typer.Option("--airflow-password", envvar=KAPPA_AIRFLOW_PASSWORD, help="its password (default: admin, or the running stack's)")]
FollowTimeout = Annotated[float, typer.Option("--timeout", min=1, help="seconds to follow the run before giving up")]


def _airflow_target(cli: Cli, url: str | None, user: str | None, password: str | None) -> tuple[str, str, str]:
    """Where to trigger and as whom: the flags, else the Airflow that `kappa airflow start` runs, else admin."""
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
                               f"(or set {KAPPA_AIRFLOW_URL})")
        url = stack.url
    if user is None:
        user = stack.username if stack is not None else "admin"
    if password is None:
        password = stack.password if stack is not None and stack.password else "admin"
    return url, user, password


def _follow(cli: Cli, dag_id: str, conf: dict[str, Any], url: str | None, user: str | None, password: str | None,
            timeout: float, as_json: bool, actor: str | None) -> None:
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
    _follow(cli_of(ctx), "kappa_reprocess", conf, airflow_url, airflow_user, airflow_password, timeout, as_json, actor)


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
    _follow(cli_of(ctx), "kappa_promote", conf, airflow_url, airflow_user, airflow_password, timeout, as_json, actor)


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
    _follow(cli_of(ctx), "kappa_rollback", conf, airflow_url, airflow_user, airflow_password, timeout, as_json, actor)
