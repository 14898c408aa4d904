"""
### kappa_throttle: change the share of a running backfill

Triggered by hand (**Trigger Dag** in the UI), like a reindex's rethrottle. A version that runs and
does not serve yet (starting, backfilling, caught up) shares the machine with the serving version's
live job; its **share** (0.015 to 1) is the CPU weight its job gets (its process priority, a nice
value on every thread).

- **Share** with **Adaptive** off: the share is fixed at that value; the controller leaves it alone.
- **Adaptive** on: the controller decides again (the default mode): it lowers the share while the
  serving version's lag in seconds is over the pipeline's `backfill_lag_bound_seconds` and raises it
  back, at most once per `backfill_interval_seconds`. The share field is then ignored.

The same verb as `kappa throttle PIPELINE VERSION --share 0.3` / `--adaptive`: applied to the running
job at once, recorded in the audit log (`airflow:<your user>`, your reason, this run) and shown in
`kappa status` and the lag plot. Refused (the run fails, no retry) for an unknown version or one
that serves or does not run.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from orchestrator.airflow import params as form
from orchestrator.airflow import throttle_tasks

CHOICES = form.form_choices()


@dag(
    dag_id="kappa_throttle",
    schedule=None,
    catchup=False,
    tags=["kappa"],
    doc_md=__doc__,
    params={
        "pipeline": form.pipeline_param(CHOICES),
        "version": Param(1, type="integer", minimum=1, title="Version",
                         description="The running version whose share to change (not the serving one)."),
        "share": Param(0.5, type="number", exclusiveMinimum=0, maximum=1, title="Share",
                       description="Its share of the machine, in (0, 1]; fixed from now on (ignored when Adaptive)."),
        "adaptive": Param(False, type="boolean", title="Adaptive",
                          description="Let the controller decide again from the share in force."),
        "reason": form.reason_param(),
    },
)
def kappa_throttle():
    @task(retries=0)
    def throttle(params=None, dag_run=None) -> dict:
        return throttle_tasks.throttle(params["pipeline"], params["version"], params["share"], params["adaptive"],
                                       params["reason"], user=dag_run.triggering_user_name, run_id=dag_run.run_id)

    throttle()


kappa_throttle()
