"""What kappa_monitor runs: the watch pass of every pipeline, then the monitor pass.

Plain functions, as in `orchestrator.airflow.tasks` (whose helpers they use); `dags/kappa_monitor.py`
wraps them, one call per task body. Each task logs one line per thing it did or found, in words
(`lifecycle.monitor.report_lines`, `watch_lines`): what it sampled, restarted, stopped and why.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from orchestrator.airflow import tasks
from orchestrator.airflow.tasks import actor_for, refusals_are_final
from orchestrator.core.exceptions import KappaError

__all__ = ["watch", "monitor"]

log = logging.getLogger("kappa.airflow")


@refusals_are_final
def watch(*, user: str | None, run_id: str, dag_id: str = "kappa_monitor", outlet_events: Any = None) -> list:
    """The watch pass of every pipeline (`orchestrator.lifecycle.watch`): each automatic rollback is an
    event on the alias's Asset. Succeeds (so that Airflow records the events); `monitor` fails on them."""
    from orchestrator.airflow.assets import announce_flip
    from orchestrator.lifecycle.monitor import watch_lines
    from orchestrator.lifecycle.watch import ACTOR, watch_pass

    actions: list[dict[str, Any]] = []
    with tasks.task_kappa() as k:
        specs = k.specs()
        names = [spec.name for spec in specs]
        for spec in specs:
            name = spec.name
            try:
                done = watch_pass(k, spec, actor=actor_for(user))
            except KappaError as e:
                done = [{"kind": "watch_failed", "pipeline": name, "error": str(e)}]
            for a in done:
                if a.get("kind") == "rolled_back":
                    a["asset_event"] = announce_flip(
                        k, outlet_events, action="rollback", pipeline=name, alias=spec.alias,
                        version=int(a["to_version"]), previous_version=a["version"], flipped=True, run_tag=run_id,
                        actor=ACTOR, reason=f"automatic rollback: {a.get('cause')}", at=time.time())
            actions += done
    for line in watch_lines(actions, names):
        log.info("%s", line)
    return actions


def monitor(*, user: str | None, run_id: str, dag_id: str = "kappa_monitor",
            watched: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Sample lag of every running version, record failed jobs, reconcile aliases; raise if serving is unhealthy
    (or the `watch` task rolled a version back: `watched`, its actions)."""
    from orchestrator.lifecycle.monitor import alert, monitor as monitor_verb, report_lines

    with tasks.task_kappa() as k:
        report = monitor_verb(k, actor=actor_for(user), watched=list(watched or []), raise_on_problem=False)
        for line in report_lines(report):
            log.info("%s", line)
        alert(k, report, actor=actor_for(user))   # after saying what it did: fails the task on a problem
    return report.model_dump(mode="json")
