"""DAG integrity: every kappa DAG imports, has its tasks, params and schedule, and parsing it
contacts nothing (no broker, no Spark, no registry, no process)."""

from __future__ import annotations

import copy
import subprocess
from datetime import timedelta

import pytest

from orchestrator.airflow.stack import DAGS_FOLDER, KAPPA_DAG_IDS

pytestmark = pytest.mark.airflow

EXPECTED_TASKS = {
    "kappa_reprocess": ["validate", "preview_rules", "start_version", "wait_ready", "validation_report", "promote", "stop_previous"],
    "kappa_promote": ["check", "promote", "stop_previous"],
    "kappa_rollback": ["prepare", "wait_ready", "flip"],
    "kappa_monitor": ["watch", "monitor"],
    "kappa_throttle": ["throttle"],
}
EXPECTED_PARAMS = {
    "kappa_reprocess": {"pipeline", "rules_version", "catchup_threshold", "auto_promote", "grace_period_seconds",
                        "catchup_deadline_minutes", "reason"},
    "kappa_promote": {"pipeline", "version", "grace_period_seconds", "reason", "force", "allow_schema_change"},
    "kappa_rollback": {"pipeline", "to_version", "catchup_deadline_minutes", "force", "reason"},
    "kappa_monitor": set(),
    "kappa_throttle": {"pipeline", "version", "share", "adaptive", "reason"},
}


@pytest.fixture
def clean_kappa_env(monkeypatch):
    """The repo's deploy/pipelines.toml, whatever the caller's environment says."""
    for var in ("KAPPA_PIPELINES", "KAPPA_HOME", "KAPPA_CONFIG", "KAPPA_REGISTRY_URL", "KAPPA_AIRFLOW_POKE_SECONDS"):
        monkeypatch.delenv(var, raising=False)


def parse(folder=DAGS_FOLDER):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(folder))


class Forbidden(Exception):
    pass


def forbid(what):
    def boom(*args, **kwargs):
        raise Forbidden(f"{what} called while parsing the DAGs")
    return boom


@pytest.fixture
def no_side_effects(monkeypatch):
    """Kafka clients, Spark sessions, the registry and child processes all raise if touched.

    Airflow's own imports run `file` once (croniter asks platform.architecture()): they are
    made first. kappa's modules that the DAG files import are imported afresh, under the patches.
    """
    import confluent_kafka
    import confluent_kafka.admin
    import croniter  # noqa: F401
    from airflow.dag_processing.dagbag import DagBag  # noqa: F401
    from pyspark.sql import SparkSession

    import orchestrator.registry.store

    import_afresh(monkeypatch, ("orchestrator.airflow.tasks", "orchestrator.airflow.params", "orchestrator.core.pipelines",
                                "orchestrator.core.settings", "jobs.lib.rules.files"))

    for name in ("Producer", "Consumer"):
        monkeypatch.setattr(confluent_kafka, name, forbid(f"confluent_kafka.{name}"))
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", forbid("confluent_kafka.admin.AdminClient"))
    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", forbid("SparkSession.builder.getOrCreate"))
    monkeypatch.setattr(orchestrator.registry.store.Registry, "__init__", forbid("Registry()"))
    monkeypatch.setattr(subprocess, "Popen", forbid("subprocess.Popen"))


def import_afresh(monkeypatch, names) -> None:
    """The next import of each module in `names` runs its code again. Afterwards the module from before is back,
    in `sys.modules` and as its package's attribute too: a fresh import sets that attribute, and a module
    imported before (`orchestrator.airflow.monitor_tasks` holds `tasks`) must see the module a later test patches."""
    import importlib
    import sys

    for name in names:
        parent, _, child = name.rpartition(".")
        if name in sys.modules:
            monkeypatch.setattr(importlib.import_module(parent), child, sys.modules[name])
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_a_module_imported_afresh_is_the_one_from_before_again_afterwards():
    """Found when a later test patched `tasks.task_kappa` and `monitor_tasks` called the fresh module's: the watch
    task then opened the default kappa home in the working directory."""
    import importlib
    import sys

    import orchestrator.airflow.tasks as before

    with pytest.MonkeyPatch.context() as mp:
        import_afresh(mp, ["orchestrator.airflow.tasks"])
        assert importlib.import_module("orchestrator.airflow.tasks") is not before
    from orchestrator.airflow import tasks

    assert tasks is before and sys.modules["orchestrator.airflow.tasks"] is before


def test_every_dag_imports_without_touching_broker_spark_or_registry(clean_kappa_env, no_side_effects):
    bag = parse()
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == sorted([*KAPPA_DAG_IDS, "kappa_example_downstream"])


@pytest.mark.parametrize("dag_id", KAPPA_DAG_IDS)
def test_tasks_and_params(clean_kappa_env, dag_id):
    dag = parse().dags[dag_id]
    assert [t.task_id for t in dag.tasks] == EXPECTED_TASKS[dag_id]
    assert set(dag.params.keys()) == EXPECTED_PARAMS[dag_id]
    assert set(dag.tags) == {"kappa"} and dag.doc_md and "###" in dag.doc_md


def test_reprocess_chain_and_sensor(clean_kappa_env):
    dag = parse().dags["kappa_reprocess"]
    chain = EXPECTED_TASKS["kappa_reprocess"]
    for up, down in zip(chain, chain[1:]):
        assert down in dag.get_task(up).downstream_task_ids, f"{up} >> {down}"
    wait = dag.get_task("wait_ready")
    assert wait.mode == "poke"   # not "reschedule": apache/airflow#71172 (orchestrator.airflow.params.SENSOR_MODE)
    assert wait.poke_interval >= 2 and wait.timeout == timedelta(hours=24).total_seconds()
    # a refusal is final; a worker that died is retried (and resumes from the registry)
    assert dag.get_task("validate").retries == 0
    assert dag.get_task("start_version").retries == 1
    assert dag.schedule is None and dag.catchup is False


@pytest.mark.parametrize("dag_id", ["kappa_reprocess", "kappa_promote"])
def test_no_promote_run_waits_out_the_grace_period_and_a_promote_not_made_is_not_a_success(clean_kappa_env, dag_id):
    """Issue 22, items 1 and 4: `promote` was a short-circuit task (a green success that promoted nothing) and
    `stop_previous` a sensor that kept the promote's run Running for the whole standby grace period."""
    from airflow.sdk.bases.sensor import BaseSensorOperator
    from airflow.providers.standard.operators.python import ShortCircuitOperator

    dag = parse().dags[dag_id]
    assert not isinstance(dag.get_task("stop_previous"), BaseSensorOperator)
    assert not isinstance(dag.get_task("promote"), ShortCircuitOperator)


def test_monitor_runs_every_minute_without_catchup(clean_kappa_env):
    dag = parse().dags["kappa_monitor"]
    assert dag.schedule == timedelta(minutes=1)
    assert dag.catchup is False and dag.max_active_runs == 1


def test_form_offers_declared_pipelines_and_rules_files(clean_kappa_env):
    from jobs.lib.rules.files import available_rules
    from orchestrator.core.pipelines import load_pipelines

    params = parse().dags["kappa_reprocess"].params
    declared = list(load_pipelines())
    assert params.get_param("pipeline").schema["enum"] == declared
    assert params["pipeline"] == "standardize"
    versions = available_rules("titles")
    assert versions and params.get_param("rules_version").schema["enum"] == [None, *versions]
    assert params["auto_promote"] is True
    # the switch's help holds true in either position: it says what each position does
    help_text = params.get_param("auto_promote").description
    assert help_text.startswith("On: ") and "Off: " in help_text
    for dag_id in ("kappa_promote", "kappa_rollback"):
        assert parse().dags[dag_id].params.get_param("pipeline").schema["enum"] == declared


def test_conf_validation_names_the_bad_param(clean_kappa_env):
    from airflow.sdk.exceptions import ParamValidationError

    params = copy.deepcopy(parse().dags["kappa_reprocess"].params)
    with pytest.raises(ParamValidationError, match="param rules_version: 'v9' is not one of"):
        params.update({"rules_version": "v9"})
    with pytest.raises(ParamValidationError, match="param pipeline: 'nope' is not one of"):
        params.update({"pipeline": "nope"})
    with pytest.raises(ParamValidationError, match="param reason"):
        params.validate()  # no reason given: required
    params.update({"reason": "new title rules", "rules_version": "v2"})
    assert params.validate()["rules_version"] == "v2"


def test_dropdown_follows_the_pipelines_file(tmp_path, monkeypatch, clean_kappa_env):
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text(
        '[pipelines.first_one]\njob = "standardize"\ntopics = ["t1"]\nkey = "member_id"\nruleset = "titles"\n'
        'alias = "first_served"\n\n'
        '[pipelines.second_one]\njob = "pageviews_hourly"\ntopics = ["t2"]\nkey = "member_id"\nalias = "second_served"\n')
    monkeypatch.setenv("KAPPA_PIPELINES", str(pipelines))
    params = parse().dags["kappa_reprocess"].params
    assert params.get_param("pipeline").schema["enum"] == ["first_one", "second_one"]
    assert params["pipeline"] == "first_one"


def test_broken_pipelines_file_is_an_import_error_naming_it(tmp_path, monkeypatch, clean_kappa_env):
    pipelines = tmp_path / "pipelines.toml"
    pipelines.write_text('[pipelines.bad]\njob = "standardize"\ntopics = "not a list"\nkey = "k"\nalias = "a"\n')
    monkeypatch.setenv("KAPPA_PIPELINES", str(pipelines))
    bag = parse()
    assert set(bag.import_errors) == {str(DAGS_FOLDER / f"{d}.py") for d in ("kappa_reprocess", "kappa_promote",
                                                                               "kappa_rollback", "kappa_throttle",
                                                                               "kappa_example_downstream")}
    message = next(iter(bag.import_errors.values()))
    assert "ConfigError" in message and str(pipelines) in message and "topics" in message
    assert "kappa_monitor" in bag.dag_ids  # the monitor has no form: it still parses


def test_only_the_flip_tasks_announce_flips_and_the_example_follows_every_alias(clean_kappa_env):
    from airflow.sdk import AssetAny

    from orchestrator.airflow.assets import FLIPS, kappa_alias_asset
    from orchestrator.core.pipelines import load_pipelines

    bag = parse()
    flip_tasks = {("kappa_promote", "promote"), ("kappa_reprocess", "promote"), ("kappa_rollback", "flip"),
                  ("kappa_monitor", "watch")}
    for dag_id in KAPPA_DAG_IDS:
        for t in bag.dags[dag_id].tasks:
            assert t.outlets == ([FLIPS] if (dag_id, t.task_id) in flip_tasks else []), (dag_id, t.task_id)
    example = bag.dags["kappa_example_downstream"]
    assert example.is_paused_upon_creation is True and example.catchup is False
    assert [t.task_id for t in example.tasks] == ["log_flips"]
    aliases = [spec.alias for spec in load_pipelines().values()]
    assert "member_profiles_std" in aliases
    assert example.schedule == AssetAny(*(kappa_alias_asset(a) for a in aliases))
