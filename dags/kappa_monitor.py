"""
### kappa_monitor: watch every running version, every minute

Scheduled every minute (no catch-up, one run at a time). Two tasks. **watch** samples every
promoted version under watch (pipelines with `auto_rollback`, over their grace period) and rolls
one that degrades back to its standby; each automatic rollback is an event on the alias's Asset.
Then **monitor** (it runs whatever watch did), which:

- samples the lag of every running version into kappa's registry (the catch-up curves of
  `kappa lag-plot` and the ETA come from these samples);
- detects failed jobs (exited, failed status, stale heartbeat) and records them;
- reconciles aliases (a flip interrupted before its publish is published) and stops standby
  versions whose grace period is over (after their micro-batch in flight, within the pipeline's
  `stop_timeout_seconds`);
- **fails** when a serving version's job is failing or its lag is beyond its pipeline's
  threshold, with a message naming the version and the lag, so that Airflow's failure
  alerting (e-mail, callbacks, the red square in the grid) tells the operator; it also fails
  after an automatic rollback, naming the pipeline, the version and the cause.

Each task's log says what it did, one line in words per action (what it sampled, restarted or
stopped, and how). Its actions are recorded in the audit log as `airflow:scheduler`.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag, task

from orchestrator.airflow import monitor_tasks
from orchestrator.airflow.assets import FLIPS


@dag(
    dag_id="kappa_monitor",
    schedule=timedelta(minutes=1),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=5),
    tags=["kappa"],
    doc_md=__doc__,
    default_args={"retries": 0},
)
def kappa_monitor():
    @task(outlets=[FLIPS], execution_timeout=timedelta(minutes=2))
    def watch(dag_run=None, outlet_events=None) -> list:
        return monitor_tasks.watch(user=dag_run.triggering_user_name, run_id=dag_run.run_id,
                                   outlet_events=outlet_events)

    @task(execution_timeout=timedelta(minutes=2), trigger_rule="all_done")
    def monitor(watched: list | None = None, dag_run=None) -> dict:
        return monitor_tasks.monitor(user=dag_run.triggering_user_name, run_id=dag_run.run_id, watched=watched)

    monitor(watch())


kappa_monitor()
