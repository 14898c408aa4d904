"""The DAGs' settings: the worker's environment, or the Airflow Variable `kappa_settings` over it."""

from __future__ import annotations

import json
import shutil

import pytest
from airflow.sdk import Connection, Variable
from airflow.sdk.exceptions import AirflowNotFoundException

from jobs.lib.rules.files import RULES_DIR
from orchestrator.airflow import params, settings_var, tasks
from orchestrator.core.exceptions import ConfigError


@pytest.fixture
def no_connection(monkeypatch, tmp_path):
    for var in ("KAPPA_PIPELINES", "KAPPA_RULES", "KAPPA_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KAPPA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KAPPA_BOOTSTRAP_SERVERS", "127.0.0.1:9")

    def get(conn_id):
        raise AirflowNotFoundException(f"The conn_id `{conn_id}` isn't defined")

    monkeypatch.setattr(Connection, "get", staticmethod(get))


def _variable(monkeypatch, value):
    monkeypatch.setattr(Variable, "get", staticmethod(
        lambda key, default=None, **kw: value if key == settings_var.VARIABLE else default))


def test_the_variable_points_the_tasks_and_the_forms_at_a_teams_rules(monkeypatch, tmp_path, no_connection):
    team = tmp_path / "team" / "rules"
    shutil.copytree(RULES_DIR / "titles", team / "titles")
    shutil.copy(team / "titles" / "v2.toml", team / "titles" / "v3.toml")
    monkeypatch.setenv("KAPPA_RULES", str(tmp_path / "elsewhere"))         # the Variable wins over it
    _variable(monkeypatch, json.dumps({"rules_location": str(team)}))
    with tasks.task_kappa() as k:
        assert k.settings.rules_location == str(team)
        assert k.settings.source_of("rules_location") == "Airflow Variable 'kappa_settings'"
        assert k.settings.bootstrap_servers == "127.0.0.1:9"             # the environment's, untouched
    choices = params.form_choices()
    assert choices["rules_by_pipeline"]["standardize"] == ["v1", "v2", "v3"]


def test_without_the_variable_the_environment_stands(monkeypatch, tmp_path, no_connection):
    monkeypatch.setenv("KAPPA_RULES", str(tmp_path / "team-rules"))
    _variable(monkeypatch, None)
    with tasks.task_kappa() as k:
        assert k.settings.rules_location == str(tmp_path / "team-rules")
        assert k.settings.source_of("rules_location") == "KAPPA_RULES"


@pytest.mark.parametrize("value, message", [
    ("{not json", "Airflow Variable 'kappa_settings' is not valid JSON (Expecting property name enclosed in "
                  "double quotes at line 1 column 2); set it to an object such as"),
    ('["a"]', "Airflow Variable 'kappa_settings' must be a JSON object of kappa settings, got list"),
    ('{"kafka_config": {"sasl.password": "x"}}', "Airflow Variable 'kappa_settings' may not hold kafka_config "
                                                 "(Kafka settings can be secrets): put them in the Airflow "
                                                 "connection kafka_default's extra"),
    ('{"rules_dir": "/x"}', "Airflow Variable 'kappa_settings': unknown setting(s) 'rules_dir'; known: home, "),
    ('{"rules_location": "s3://bucket/rules"}', "invalid setting rules_location='s3://bucket/rules' (from Airflow "
                                                "Variable 'kappa_settings'): rules are read from a local folder "
                                                "or a file:// URI; check them out to a folder; fix "
                                                "'rules_location' in the Airflow Variable 'kappa_settings'"),
])
def test_a_bad_variable_is_one_line_naming_it(monkeypatch, no_connection, value, message):
    _variable(monkeypatch, value)
    with pytest.raises(ConfigError) as e:
        settings_var.airflow_settings()
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
