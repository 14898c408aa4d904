"""What kappa_throttle runs: the operator's change of a running backfill's share, from the UI.

One plain function, as in `orchestrator.airflow.tasks` (whose helpers it uses); `dags/kappa_throttle.py`
wraps it. The same verb as `kappa throttle` (`orchestrator.lifecycle.throttle.set_throttle`), recorded
as `airflow:<user>` with the reason and the run.
"""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.airflow.tasks import actor_for, refusals_are_final, tagged_reason, task_kappa

__all__ = ["throttle"]

log = logging.getLogger("kappa.airflow")


@refusals_are_final
def throttle(pipeline: str, version: int, share: float | None = None, adaptive: bool = False,
             reason: str | None = None, *, user: str | None, run_id: str, dag_id: str = "kappa_throttle") -> dict[str, Any]:
    """Set the share of `pipeline` v`version` (fixed), or give it back to the controller (`adaptive`:
    the share is then ignored). Refused (the task fails, no retry) as `kappa throttle` refuses."""
    from orchestrator.airflow import notes
    from orchestrator.lifecycle.throttle import set_throttle

    with task_kappa() as k:
        v = k.version(pipeline, version)
        res = set_throttle(v, actor=actor_for(user), share=None if adaptive else share, adaptive=adaptive,
                           reason=tagged_reason(reason, dag_id, run_id, f"throttle requested in Airflow by {user}"))
    log.info("%s", res["message"])
    notes.set_run_note(res["message"], [])
    return res
