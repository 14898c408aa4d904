"""Settings: CLI flag > environment variable > config file > default, resolved in one function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from orchestrator.core.exceptions import ConfigError
from orchestrator.context import Kappa
from orchestrator.core.paths import alias_pointer_path, version_paths
from orchestrator.core.resources import default_pipelines_file
from orchestrator.core.settings import CLI_FLAGS, ENV_VARS, Settings, resolve_settings


def write_config(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_follow_cwd(tmp_path):
    s = resolve_settings(env={}, cwd=tmp_path)
    home = tmp_path / ".kappa"
    assert s.home == home
    assert s.warehouse == str(home / "warehouse")
    assert s.checkpoints is None
    assert s.state_dir == home / "state"
    assert s.registry_url == f"sqlite:///{home / 'registry.db'}"
    assert s.bootstrap_servers is None
    assert s.kafka_config == {}
    assert s.group_prefix == "kappa"
    assert s.pipelines_file == default_pipelines_file()
    assert s.spark_master == "local[2]"
    assert all(s.source_of(f) == "default" for f in ENV_VARS)
    assert s.config_file is None


@pytest.mark.parametrize("field,file_value,env_value,cli_value,expected", [
    ("spark_master", "spark://file:7077", "spark://env:7077", "spark://cli:7077", None),
    ("group_prefix", "fromfile", "fromenv", "fromcli", None),
    ("bootstrap_servers", "file:9092", "env:9092", "cli:9092", None),
    ("registry_url", "sqlite:////f/r.db", "sqlite:////e/r.db", "sqlite:////c/r.db", None),
    ("warehouse", "/file/wh", "/env/wh", "/cli/wh", None),
    ("warehouse", "s3://file/wh", "file:///env/wh", "gs://cli/wh", None),
    ("checkpoints", "/file/ck", "s3://env/ck", "/cli/ck", None),
    ("state_dir", "/file/st", "/env/st", "/cli/st", Path),
    ("pipelines_file", "/file/p.toml", "/env/p.toml", "/cli/p.toml", Path),
])
def test_each_layer_wins_over_the_next(tmp_path, field, file_value, env_value, cli_value, expected):
    cfg = write_config(tmp_path / "kappa.toml", f'{field} = "{file_value}"\n')
    conv = expected or (lambda v: v)
    var, flag = ENV_VARS[field], CLI_FLAGS[field]

    only_file = resolve_settings(cfg, env={}, cwd=tmp_path)
    assert getattr(only_file, field) == conv(file_value)
    assert only_file.source_of(field) == f"config file {cfg}"

    env_over_file = resolve_settings(cfg, env={var: env_value}, cwd=tmp_path)
    assert getattr(env_over_file, field) == conv(env_value)
    assert env_over_file.source_of(field) == var

    cli_over_env = resolve_settings(cfg, env={var: env_value}, cwd=tmp_path, **{field: cli_value})
    assert getattr(cli_over_env, field) == conv(cli_value)
    assert cli_over_env.source_of(field) == flag


def test_none_cli_value_and_empty_env_count_as_unset(tmp_path):
    cfg = write_config(tmp_path / "kappa.toml", 'spark_master = "spark://file:7077"\n')
    s = resolve_settings(cfg, env={"KAPPA_SPARK_MASTER": ""}, cwd=tmp_path, spark_master=None)
    assert s.spark_master == "spark://file:7077"


def test_home_moves_derived_paths_unless_they_are_set(tmp_path):
    s = resolve_settings(env={"KAPPA_HOME": str(tmp_path / "h"), "KAPPA_WAREHOUSE": "/data/wh"}, cwd=tmp_path)
    assert s.home == tmp_path / "h"
    assert s.state_dir == tmp_path / "h" / "state"
    assert s.registry_url == f"sqlite:///{tmp_path / 'h' / 'registry.db'}"
    assert s.warehouse == "/data/wh"


def test_config_file_found_in_home(tmp_path):
    home = tmp_path / "h"
    write_config(home / "kappa.toml", 'group_prefix = "acme.kappa"\n')
    s = resolve_settings(env={"KAPPA_HOME": str(home)}, cwd=tmp_path)
    assert s.group_prefix == "acme.kappa"
    assert s.config_file == home / "kappa.toml"
    s2 = resolve_settings(env={}, cwd=tmp_path, home=str(home))
    assert s2.group_prefix == "acme.kappa"


def test_config_file_from_kappa_config_env(tmp_path):
    cfg = write_config(tmp_path / "etc" / "k.toml", 'spark_master = "local[1]"\n')
    s = resolve_settings(env={"KAPPA_CONFIG": str(cfg)}, cwd=tmp_path)
    assert s.spark_master == "local[1]"


def test_relative_paths(tmp_path):
    cfg = write_config(tmp_path / "etc" / "kappa.toml", 'warehouse = "wh"\nstate_dir = "../st"\n')
    s = resolve_settings(cfg, env={"KAPPA_PIPELINES": "p.toml"}, cwd=tmp_path / "work", home="h")
    assert s.warehouse == str(tmp_path / "etc" / "wh")
    assert s.state_dir == tmp_path / "st"
    assert s.pipelines_file == tmp_path / "work" / "p.toml"
    assert s.home == tmp_path / "work" / "h"


def test_kafka_config_merges_key_by_key_and_masks_secrets(tmp_path):
    cfg = write_config(tmp_path / "kappa.toml", """
[kafka_config]
"security.protocol" = "SASL_SSL"
"sasl.mechanism" = "PLAIN"
"sasl.username" = "file-user"
"sasl.password" = "file-secret"
"enable.ssl.certificate.verification" = true
""")
    env = {"KAPPA_KAFKA_CONFIG": json.dumps({"sasl.username": "env-user", "sasl.password": "env-secret"})}
    s = resolve_settings(cfg, env=env, cwd=tmp_path, kafka_config={"sasl.password": "cli-secret"})
    assert isinstance(s.kafka_config["sasl.password"], SecretStr)
    assert s.kafka_client_config() == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "env-user",
        "sasl.password": "cli-secret", "enable.ssl.certificate.verification": "true"}
    assert "cli-secret" not in repr(s)
    assert "cli-secret" not in json.dumps(s.model_dump(mode="json"))
    assert json.loads(s.kafka_config_json())["sasl.password"] == "cli-secret"
    assert s.source_of("kafka_config") == f"config file {cfg} + KAPPA_KAFKA_CONFIG + --kafka-config"


def test_kafka_client_config_adds_bootstrap(tmp_path):
    s = resolve_settings(env={"KAPPA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
                              "KAPPA_KAFKA_CONFIG": '{"ssl.key.password": "k"}'}, cwd=tmp_path)
    assert s.kafka_client_config(**{"group.id": "g"}) == {
        "bootstrap.servers": "127.0.0.1:9092", "ssl.key.password": "k", "group.id": "g"}


def test_registry_password_is_masked(tmp_path):
    s = resolve_settings(env={"KAPPA_REGISTRY_URL": "postgresql+psycopg2://kappa:s3cret@db:5432/kappa"},
                         cwd=tmp_path)
    assert s.registry_url.endswith("kappa:s3cret@db:5432/kappa")
    assert "s3cret" not in repr(s)
    assert s.model_dump(mode="json")["registry_url"] == "postgresql+psycopg2://kappa:***@db:5432/kappa"


def test_settings_is_frozen(tmp_path):
    s = Settings(home=tmp_path)
    with pytest.raises(ValidationError):
        s.spark_master = "local[4]"  # type: ignore[misc]


def test_version_paths_follow_the_contract(tmp_path):
    s = Settings(home=tmp_path, group_prefix="acme")
    p = version_paths(s, "standardize", 3)
    assert p.table == str(tmp_path / "warehouse" / "standardize" / "v3")
    assert p.rejects == str(tmp_path / "warehouse" / "standardize" / "v3__rejects")
    assert p.checkpoint == str(tmp_path / "state" / "standardize" / "v3" / "checkpoint")
    assert p.run_dir == tmp_path / "state" / "standardize" / "v3" / "run"
    assert p.group_id == "acme.standardize.v3"
    assert p.app_id == "kappa.standardize.v3"
    assert Kappa(s).paths("standardize", 3) == p
    assert p.model_dump(mode="json")["table"] == str(tmp_path / "warehouse" / "standardize" / "v3")
    assert alias_pointer_path(s.warehouse, "member_profiles_std") == str(tmp_path / "warehouse" / "_aliases" / "member_profiles_std.json")
    assert Kappa(s).alias_file("member_profiles_std") == alias_pointer_path(s.warehouse, "member_profiles_std")


def test_version_paths_refuse_bad_names(tmp_path):
    s = Settings(home=tmp_path)
    with pytest.raises(ConfigError, match=r"invalid pipeline name '\.\./etc'"):
        version_paths(s, "../etc", 1)
    with pytest.raises(ConfigError, match="invalid version 0: must be a positive integer"):
        version_paths(s, "standardize", 0)
    with pytest.raises(ConfigError, match=r"invalid alias name 'a/b'"):
        alias_pointer_path(s.warehouse, "a/b")


# -- errors name the setting, where it came from and how to fix it -----------------------------

def test_bad_env_value_names_the_variable(tmp_path):
    with pytest.raises(ConfigError) as e:
        resolve_settings(env={"KAPPA_REGISTRY_URL": "mysql://u:pw@h/db"}, cwd=tmp_path)
    assert str(e.value) == (
        "invalid setting registry_url='mysql://u:***@h/db' (from KAPPA_REGISTRY_URL): the registry runs on "
        "SQLite or PostgreSQL, not mysql; expected sqlite:///<path> or "
        "postgresql+psycopg2://<user>[:<password>]@<host>:<port>/<db>; fix or unset the environment variable "
        "KAPPA_REGISTRY_URL")


def test_bad_cli_value_names_the_flag(tmp_path):
    with pytest.raises(ConfigError) as e:
        resolve_settings(env={}, cwd=tmp_path, group_prefix="my group")
    assert str(e.value) == (
        "invalid setting group_prefix='my group' (from --group-prefix): must be 1 to 100 characters from "
        "A-Z, a-z, 0-9, '.', '_', '-', starting with a letter or digit; fix the --group-prefix flag")


def test_bad_file_value_names_the_file(tmp_path):
    cfg = write_config(tmp_path / "kappa.toml", 'spark_master = "local [2]"\n')
    with pytest.raises(ConfigError) as e:
        resolve_settings(cfg, env={}, cwd=tmp_path)
    assert str(e.value) == (
        f"invalid setting spark_master='local [2]' (from config file {cfg}): expected a Spark master URL "
        f"such as local[2] or spark://127.0.0.1:7077; fix 'spark_master' in the {cfg}")


def test_bad_kafka_config_json(tmp_path):
    with pytest.raises(ConfigError) as e:
        resolve_settings(env={"KAPPA_KAFKA_CONFIG": "{not json"}, cwd=tmp_path)
    assert str(e.value) == (
        "invalid setting kafka_config (from KAPPA_KAFKA_CONFIG): not valid JSON (Expecting property name "
        "enclosed in double quotes at line 1 column 2); expected an object such as "
        '{"security.protocol": "SASL_SSL"}; fix or unset the environment variable KAPPA_KAFKA_CONFIG')
    with pytest.raises(ConfigError, match=r"kafka_config \(from --kafka-config\): expected a JSON object, got list"):
        resolve_settings(env={}, cwd=tmp_path, kafka_config="[1]")


def test_unknown_key_in_config_file(tmp_path):
    cfg = write_config(tmp_path / "kappa.toml", 'warehous = "/x"\n')
    with pytest.raises(ConfigError) as e:
        resolve_settings(cfg, env={}, cwd=tmp_path)
    assert str(e.value) == (
        f"config file {cfg}: unknown setting 'warehous'; known settings: home, warehouse, state_dir, "
        f"checkpoints, registry_url, bootstrap_servers, kafka_config, group_prefix, pipelines_file, rules_location, "
        f"job_path, spark_master, lag_sample_retention_seconds, readiness_window_seconds")


def test_job_path_is_folders_made_absolute_from_a_list_in_the_file_or_a_string_in_the_environment(tmp_path):
    import os

    cfg = write_config(tmp_path / "conf" / "kappa.toml", 'job_path = ["../team-repo", "/srv/shared-jobs"]\n')
    s = resolve_settings(cfg, env={}, cwd=tmp_path)
    assert s.job_folders == [str(tmp_path / "team-repo"), "/srv/shared-jobs"]
    s = resolve_settings(None, env={"KAPPA_JOB_PATH": os.pathsep.join(["repo", "/abs"])}, cwd=tmp_path)
    assert s.job_folders == [str(tmp_path / "repo"), "/abs"] and s.source_of("job_path") == "KAPPA_JOB_PATH"
    assert s.to_env()["KAPPA_JOB_PATH"] == os.pathsep.join([str(tmp_path / "repo"), "/abs"])
    assert resolve_settings(None, env={}, cwd=tmp_path).job_folders == []
    bad = write_config(tmp_path / "bad" / "kappa.toml", "job_path = 3\n")
    with pytest.raises(ConfigError, match=r"setting 'job_path' must be a string, got int 3"):
        resolve_settings(bad, env={}, cwd=tmp_path)


def test_config_file_wrong_type_and_bad_toml(tmp_path):
    cfg = write_config(tmp_path / "kappa.toml", "group_prefix = 3\n")
    with pytest.raises(ConfigError, match=r"setting 'group_prefix' must be a string, got int 3"):
        resolve_settings(cfg, env={}, cwd=tmp_path)
    write_config(cfg, "group_prefix = \n")
    with pytest.raises(ConfigError, match=rf"config file {cfg} is not valid TOML: "):
        resolve_settings(cfg, env={}, cwd=tmp_path)


def test_missing_explicit_config_file(tmp_path):
    with pytest.raises(ConfigError) as e:
        resolve_settings(tmp_path / "nope.toml", env={}, cwd=tmp_path)
    assert str(e.value) == f"config file {tmp_path / 'nope.toml'} (from --config) does not exist; " \
                           f"fix the path or drop --config"
    with pytest.raises(ConfigError, match=r"\(from KAPPA_CONFIG\) does not exist; fix or unset KAPPA_CONFIG"):
        resolve_settings(env={"KAPPA_CONFIG": str(tmp_path / "nope.toml")}, cwd=tmp_path)


def test_unknown_cli_override(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) sparkmaster; known settings: home, "):
        resolve_settings(env={}, cwd=tmp_path, sparkmaster="local")


def test_reads_os_environ_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("KAPPA_HOME", str(tmp_path / "envhome"))
    monkeypatch.setenv("KAPPA_SPARK_MASTER", "local[1]")
    monkeypatch.delenv("KAPPA_CONFIG", raising=False)
    s = resolve_settings()
    assert s.home == tmp_path / "envhome"
    assert s.spark_master == "local[1]"


def test_to_env_round_trips(tmp_path):
    s = resolve_settings(env={"KAPPA_KAFKA_CONFIG": '{"sasl.password": "pw", "linger.ms": 5}'}, cwd=tmp_path,
                         home=str(tmp_path / "h"), bootstrap_servers="127.0.0.1:9092", group_prefix="acme",
                         registry_url="postgresql+psycopg2://k:pw@db/k")
    env = s.to_env()
    assert env["KAPPA_KAFKA_CONFIG"] == '{"linger.ms": "5", "sasl.password": "pw"}'
    again = resolve_settings(env=env, cwd=tmp_path / "elsewhere")
    assert again.model_dump() == s.model_dump()
    assert again.kafka_client_config() == s.kafka_client_config()
    assert "KAPPA_BOOTSTRAP_SERVERS" not in Settings(home=tmp_path).to_env()


# -- pydantic-settings: resolve_settings arms the layers, direct construction reads nothing ----------

def test_direct_construction_reads_neither_environment_nor_config_file(tmp_path, monkeypatch):
    write_config(tmp_path / ".kappa" / "kappa.toml", 'group_prefix = "fromfile"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KAPPA_SPARK_MASTER", "local[7]")
    monkeypatch.setenv("KAPPA_CONFIG", str(tmp_path / ".kappa" / "kappa.toml"))
    resolved = resolve_settings()
    assert (resolved.spark_master, resolved.group_prefix) == ("local[7]", "fromfile")
    direct = Settings(home=tmp_path / "h")
    assert (direct.spark_master, direct.group_prefix) == ("local[2]", "kappa")
    assert direct.config_file is None and direct.source_of("spark_master") == "default"
    assert Settings().home == tmp_path / ".kappa"


def test_other_kappa_variables_do_not_disturb_the_settings(tmp_path):
    from pydantic_settings import BaseSettings

    assert issubclass(Settings, BaseSettings)
    s = resolve_settings(env={"KAPPA_AIRFLOW_URL": "http://127.0.0.1:8080", "KAPPA_LAUNCH_ID": "x",
                              "KAPPA_NOT_A_SETTING": "1", "kappa_home": "/lower/case", "KAPPA_GROUP_PREFIX": "e"},
                         cwd=tmp_path)
    assert (s.home, s.group_prefix) == (tmp_path / ".kappa", "e")
    assert s.source_of("home") == "default" and s.source_of("group_prefix") == "KAPPA_GROUP_PREFIX"


def test_kafka_config_from_one_layer_names_that_layer(tmp_path):
    s = resolve_settings(env={}, cwd=tmp_path, kafka_config='{"linger.ms": 5}')
    assert s.kafka_config == {"linger.ms": "5"} and s.source_of("kafka_config") == "--kafka-config"
