"""
### kappa_example_downstream: runs after a serving alias flips

An example of a DAG downstream of kappa, **paused when created**: unpause it to try it. Every
flip of a serving alias (a promote in `kappa_promote` or `kappa_reprocess`, a rollback in
`kappa_rollback`) is an event on the alias's Airflow Asset, named `kappa.<alias>` (URI
`kappa://alias/<alias>`). This DAG is scheduled on the Assets of all the aliases declared in the
pipelines file (any of them), and its one task logs what each flip serves now and returns it
(the XCom): pipeline, alias, promote or rollback, version and previous version, rules version and
hash, table, who and why.

Your own DAG follows one alias like this:

```python
from orchestrator.airflow.assets import kappa_alias_asset

@dag(schedule=[kappa_alias_asset("member_profiles_std")], catchup=False)
def refresh_dashboards():
    @task
    def refresh(triggering_asset_events=None):
        for event in triggering_asset_events[kappa_alias_asset("member_profiles_std")]:
            print(event.extra["version"], event.extra["table"])
    refresh()
```
"""

from __future__ import annotations

from airflow.sdk import dag, task

from orchestrator.airflow import assets

ALIAS_ASSETS = assets.declared_alias_assets()


@dag(
    dag_id="kappa_example_downstream",
    schedule=assets.any_flip_of(ALIAS_ASSETS.values()),
    catchup=False,
    is_paused_upon_creation=True,
    max_active_runs=1,
    tags=["kappa", "example"],
    doc_md=__doc__,
)
def kappa_example_downstream():
    @task
    def log_flips(triggering_asset_events=None) -> list[dict]:
        return assets.flip_events(triggering_asset_events)

    log_flips()


kappa_example_downstream()
