"""
### kappa_rollback: serve an earlier version again

Triggered by hand (**Trigger Dag** in the UI, or `kappa trigger rollback PIPELINE [--to N]`).

1. **prepare**: picks the target, the version the alias served before (or the one you name). A
   standby version still runs; a version whose job was stopped is restarted from its own
   checkpoint (never from offset zero).
2. **wait_ready**: a sensor (poke mode) that logs lag and ETA until the target has caught up
   again (by the same rule as a deploy: a micro-batch committed since its restart, lag within
   `catchup_threshold` and `catchup_seconds` over spaced samples, not growing); fails when its job
   fails, or at the deadline: a target that cannot catch up in time is not flipped to, unless
   **Flip at the deadline anyway** is on (audited with the readiness it overrode).
3. **flip**: one compare-and-swap of the serving alias back to the target, the pointer file
   published, and the audit entry (`airflow:<your user>`, your reason, this run). The flip is an
   event on the alias's Asset (`kappa.<alias>`): DAGs scheduled on it run next.

Running it again after it finished is a no-op: the alias already serves the target. Like
`kappa rollback`, a run after a *rollback* cut off before its publish only publishes that flip; after
a *promote* cut off there, it publishes the promote and then rolls it back. The flip expects the
alias where **prepare** found it: a promote that lands while **wait_ready** waits is not undone,
the flip fails instead (run the rollback again if it is still wanted).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, PokeReturnValue, dag, task

from orchestrator.airflow import params as form
from orchestrator.airflow import tasks
from orchestrator.airflow.assets import FLIPS
from orchestrator.lifecycle.rollback import ROLLBACK_DEADLINE_SECONDS

CHOICES = form.form_choices()
POKE = timedelta(seconds=form.poke_seconds())


@dag(
    dag_id="kappa_rollback",
    schedule=None,
    catchup=False,
    tags=["kappa"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=20)},
    params={
        "pipeline": form.pipeline_param(CHOICES),
        "to_version": Param(None, type=["null", "integer"], minimum=1, title="Roll back to version",
                            description="Empty: the version the alias served before the current one."),
        "catchup_deadline_minutes": form.deadline_minutes_param(
            ROLLBACK_DEADLINE_SECONDS, "The run fails if a restarted target is not ready this long after the run "
                                       "started; the current version keeps serving."),
        "force": Param(False, type="boolean", title="Flip at the deadline anyway",
                       description="Off: a target not caught up by the deadline is not flipped to (the current "
                                   "version keeps serving). On: the flip happens at the deadline anyway, recorded "
                                   "in the audit log with your reason and the readiness it overrode."),
        "reason": form.reason_param(),
    },
)
def kappa_rollback():
    @task(retries=0)
    def prepare(params=None, dag_run=None) -> dict:
        return tasks.prepare_rollback(params["pipeline"], params["to_version"], params["reason"],
                                      user=dag_run.triggering_user_name, run_id=dag_run.run_id)

    @task.sensor(mode=form.SENSOR_MODE, poke_interval=POKE, timeout=timedelta(hours=24))
    def wait_ready(prepared: dict, params=None, dag_run=None) -> PokeReturnValue:
        return PokeReturnValue(**tasks.poke_rollback_ready(
            prepared, user=dag_run.triggering_user_name, deadline_at=form.deadline_at(dag_run, params),
            force=params["force"]))

    @task(outlets=[FLIPS])
    def flip(prepared: dict, readiness: dict | None, params=None, dag_run=None, outlet_events=None) -> dict:
        return tasks.rollback(prepared, params["reason"],
                              deadline_at=form.deadline_at(dag_run, params), user=dag_run.triggering_user_name,
                              run_id=dag_run.run_id, outlet_events=outlet_events, force=params["force"])

    prepared = prepare()
    flip(prepared, wait_ready(prepared))


kappa_rollback()
