"""
### kappa_reprocess: rebuild a pipeline's table with new rules, then serve it

Triggered by hand (**Trigger Dag** in the UI, or `kappa trigger reprocess PIPELINE --rules v2`).
The form asks for the pipeline, the rules version, the catch-up threshold, whether to promote
automatically, the standby grace period and a reason; the run is recorded in kappa's audit log
as `airflow:<your user>` with that reason and this run's id.

1. **validate**: unknown pipeline, bad rules, a source topic that is not compacted, or a
   reprocess of the pipeline already in flight fail here at once, with kappa's message.
2. **preview_rules**: in seconds, what the new rules would change in the table served now
   (they are applied to its raw columns): rows changed per field and the top changes, in the log
   and the XCom. Advisory: with nothing served yet the run just goes on.
3. **start_version**: allocates version N and starts its Spark job from offset zero.
4. **wait_ready**: a sensor (poke mode: one task that holds a worker slot while it waits) that logs lag
   and ETA at every poke until the version is caught up; it fails when the job fails or at the
   catch-up deadline, naming the partitions still lagging.
5. **validation_report**: key counts, reject rate, what the new rules changed (XCom and log).
6. **promote**: with auto-promote on, every check again, then the atomic alias flip, an
   event on the alias's Asset (`kappa.<alias>`) that DAGs scheduled on it run after. With
   auto-promote off it ends *skipped*: the version is ready and unpromoted, and the run's note
   links to `kappa_promote` with the configuration JSON to paste.
7. **stop_previous**: the version the promote replaced stays a running standby for the grace
   period (`kappa_rollback` flips back to it at once); the task ends *skipped* saying until when,
   and `kappa_monitor` stops the standby then. With a grace period of 0 it stops it at once.

The form's pipeline dropdown shows each pipeline's backfill estimate (the log's records, the rate an
earlier version measured or a default, the cores), or "unknown" with the reason. The run's note (on
the run's page) says where the run got: the estimate when the version starts, then the estimate beside
the actual backfill time, the validation report, what was promoted or how to promote.

Retrying any task continues from what kappa's registry says happened.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, PokeReturnValue, dag, task

from orchestrator.airflow import params as form
from orchestrator.airflow import tasks
from orchestrator.airflow.assets import FLIPS
from orchestrator.lifecycle.await_ready import CATCHUP_DEADLINE_SECONDS

CHOICES = form.form_choices(estimates=True)   # the pipeline dropdown shows each backfill's estimate
POKE = timedelta(seconds=form.poke_seconds())


@dag(
    dag_id="kappa_reprocess",
    schedule=None,
    catchup=False,
    tags=["kappa"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=20)},
    params={
        "pipeline": form.pipeline_param(CHOICES),
        "rules_version": Param(
            None, type=["null", "string"], enum=[None, *CHOICES["rules_versions"]], title="Rules version",
            values_display={None: "latest (none for pipelines without rules)", **CHOICES["rules_labels"]},
            description="A rules file of the pipeline's ruleset (jobs/rules/<ruleset>/<version>.toml)."),
        "catchup_threshold": Param(None, type=["null", "integer"], minimum=0, title="Catch-up threshold (records)",
                                   description="Total lag at or under which the version counts as caught up; "
                                               "empty: the pipeline's catchup_threshold."),
        "auto_promote": Param(True, type="boolean", title="Promote automatically when ready",
                              description="On: the run promotes the version as soon as it is ready and passes "
                                          "its checks. Off: the run ends with the version ready and unpromoted; "
                                          "its promote task ends skipped and the run's note links to kappa_promote."),
        "grace_period_seconds": form.grace_period_param(),
        "catchup_deadline_minutes": form.deadline_minutes_param(
            CATCHUP_DEADLINE_SECONDS, "The run fails if the version is not ready this long after it started."),
        "reason": form.reason_param(),
    },
)
def kappa_reprocess():
    @task(retries=0)
    def validate(params=None, dag_run=None) -> dict:
        return tasks.validate_reprocess(params["pipeline"], params["rules_version"], params["catchup_threshold"],
                                        user=dag_run.triggering_user_name, run_id=dag_run.run_id)

    @task
    def preview_rules(checked: dict) -> dict:
        return tasks.preview_rules(checked["pipeline"], checked["rules_version"])

    @task
    def start_version(params=None, dag_run=None) -> dict:
        return tasks.start_reprocess(params["pipeline"], params["rules_version"], params["catchup_threshold"],
                                     params["reason"], user=dag_run.triggering_user_name, run_id=dag_run.run_id)

    @task.sensor(mode=form.SENSOR_MODE, poke_interval=POKE, timeout=timedelta(hours=24))
    def wait_ready(version: dict, params=None, dag_run=None) -> PokeReturnValue:
        return PokeReturnValue(**tasks.poke_ready(
            version["pipeline"], version["version"], user=dag_run.triggering_user_name,
            deadline_at=form.deadline_at(dag_run, params)))

    @task
    def validation_report(version: dict, readiness: dict, dag_run=None) -> dict:
        return tasks.report(version["pipeline"], version["version"], dag_id=dag_run.dag_id, run_id=dag_run.run_id)

    @task(outlets=[FLIPS])
    def promote(version: dict, report: dict, params=None, dag_run=None, outlet_events=None) -> dict | None:
        return tasks.promote_if_asked(version["pipeline"], version["version"], params["auto_promote"],
                                      params["reason"], user=dag_run.triggering_user_name, run_id=dag_run.run_id,
                                      dag_id=dag_run.dag_id, outlet_events=outlet_events, report=report,
                                      grace_seconds=params["grace_period_seconds"])

    @task
    def stop_previous(version: dict, promoted: dict, dag_run=None) -> dict:
        return tasks.stop_previous(version["pipeline"], promoted, user=dag_run.triggering_user_name,
                                   run_id=dag_run.run_id, dag_id=dag_run.dag_id)

    checked = validate()
    previewed = preview_rules(checked)
    version = start_version()
    previewed >> version
    ready = wait_ready(version)
    report = validation_report(version, ready)
    promoted = promote(version, report)
    stop_previous(version, promoted)


kappa_reprocess()
