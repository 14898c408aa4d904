"""
### kappa_promote: serve a ready version

Triggered by hand (**Trigger Dag** in the UI, or `kappa trigger promote PIPELINE VERSION`), typically
after a `kappa_reprocess` run with auto-promote off. The same checks as `kappa promote`:

1. **check**: a dry run. The version is ready (caught up, job healthy), its key count is within
   the pipeline's tolerance of the serving version's, its reject rate is under the limit, no column
   was removed or retyped (unless **Allow schema change**), the pipeline's own checks pass; the log
   lists every check and exactly what the promote will do. Fails here if any check fails, unless
   **Force** is set with a Reason (audited; readiness cannot be forced).
2. **promote**: the checks again, then one compare-and-swap of the serving alias, the pointer
   file published for readers, and the audit entry (`airflow:<your user>`, your reason, this run).
   The flip is an event on the alias's Asset (`kappa.<alias>`): DAGs scheduled on it run next.
   With `auto_rollback`, the promoted version is watched over the grace period (`kappa_monitor`).
3. **stop_previous**: the version it replaced stays a running standby for the grace period
   (`kappa_rollback` flips back to it at once); the task ends *skipped* saying until when, so the
   run ends at the flip, and `kappa_monitor` stops the standby then. Grace 0: stopped at once.

The run's note says what was promoted and until when the previous version stays a standby.

Leave the version empty to promote the newest caught-up version of the pipeline (as
`kappa promote PIPELINE` does).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag, task

from orchestrator.airflow import params as form
from orchestrator.airflow import tasks
from orchestrator.airflow.assets import FLIPS

CHOICES = form.form_choices()


@dag(
    dag_id="kappa_promote",
    schedule=None,
    catchup=False,
    tags=["kappa"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=20)},
    params={
        "pipeline": form.pipeline_param(CHOICES),
        "version": Param(None, type=["null", "integer"], minimum=1, title="Version",
                         description="The version to serve; empty: the newest caught-up version."),
        "grace_period_seconds": form.grace_period_param(),
        "reason": form.reason_param(),
        "force": Param(False, type="boolean", title="Force",
                       description="Promote although checks failed (not readiness); needs a Reason, audited."),
        "allow_schema_change": Param(False, type="boolean", title="Allow schema change",
                                     description="Let a version whose columns were removed or retyped pass."),
    },
)
def kappa_promote():
    @task(retries=0)
    def check(params=None, dag_run=None) -> dict:
        return tasks.check_promote(params["pipeline"], params["version"], params["reason"],
                                   user=dag_run.triggering_user_name, run_id=dag_run.run_id,
                                   force=params["force"], allow_schema_change=params["allow_schema_change"])

    @task(outlets=[FLIPS])
    def promote(checked: dict, params=None, dag_run=None, outlet_events=None) -> dict:
        return tasks.promote(params["pipeline"], checked["version"], params["reason"],
                             user=dag_run.triggering_user_name, run_id=dag_run.run_id, outlet_events=outlet_events,
                             force=params["force"], allow_schema_change=params["allow_schema_change"],
                             grace_seconds=params["grace_period_seconds"])

    @task
    def stop_previous(promoted: dict, params=None, dag_run=None) -> dict:
        return tasks.stop_previous(params["pipeline"], promoted, user=dag_run.triggering_user_name,
                                   run_id=dag_run.run_id, dag_id=dag_run.dag_id)

    stop_previous(promote(check()))


kappa_promote()
