"""Kafka settings from an Airflow Connection (the apache-kafka provider's `kafka_default` convention)."""

from __future__ import annotations

import json

import pytest
from airflow.sdk import Connection
from airflow.sdk.exceptions import AirflowNotFoundException

from orchestrator.airflow import kafka_conn, tasks
from orchestrator.core.exceptions import ConfigError
from orchestrator.core.secrets import mask_secrets

SECRET = "s3cr3t-from-the-connection"


def _conn(**kw) -> Connection:
    return Connection(conn_id=kw.pop("conn_id", "kafka_default"), conn_type="kafka", **kw)


def test_the_extra_is_librdkafka_settings_and_the_password_field_a_sasl_password():
    out = kafka_conn.overrides_from("kafka_default", extra={
        "bootstrap.servers": "b1:9092,b2:9092", "security.protocol": "SASL_SSL", "group.id": "theirs",
        "enable.auto.commit": "true"}, login="svc", password=SECRET)
    assert out == {"bootstrap_servers": "b1:9092,b2:9092",
                   "kafka_config": {"security.protocol": "SASL_SSL", "sasl.username": "svc", "sasl.password": SECRET}}


def test_host_and_port_stand_in_for_bootstrap_servers_and_the_extra_wins_over_login():
    out = kafka_conn.overrides_from("k", extra={"sasl.username": "from-extra"}, host="broker", port=9093,
                                    login="from-login")
    assert out == {"bootstrap_servers": "broker:9093", "kafka_config": {"sasl.username": "from-extra"}}


@pytest.mark.parametrize("extra, message", [
    ({}, "Airflow connection 'k' names no Kafka broker: put \"bootstrap.servers\" in its extra (or set its "
         "host and port)"),
    (["not", "an", "object"], "the extra of Airflow connection 'k' must be a JSON object of librdkafka settings"),
])
def test_a_connection_kappa_cannot_use_is_one_clear_error(extra, message):
    with pytest.raises(ConfigError) as e:
        kafka_conn.overrides_from("k", extra=extra)
    assert str(e.value).startswith(message)


def test_tasks_use_the_connection_when_it_is_defined_and_mask_its_password(monkeypatch, tmp_path):
    monkeypatch.setenv("KAPPA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KAPPA_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("KAPPA_KAFKA_CONFIG", json.dumps({"client.id": "from-env", "socket.timeout.ms": "5000"}))
    asked: list[str] = []

    def get(conn_id):
        asked.append(conn_id)
        return _conn(conn_id=conn_id, password=SECRET,
                     extra=json.dumps({"bootstrap.servers": "127.0.0.1:19092", "client.id": "from-conn"}))

    monkeypatch.setattr(Connection, "get", staticmethod(get))
    monkeypatch.setenv(kafka_conn.CONN_ID_ENV, "kafka_prod")
    with tasks.task_kappa() as k:
        s = k.settings
        assert asked == ["kafka_prod"]
        assert s.bootstrap_servers == "127.0.0.1:19092"
        conf = s.kafka_client_config()
        assert (conf["client.id"], conf["socket.timeout.ms"], conf["sasl.password"]) == ("from-conn", "5000", SECRET)
        assert SECRET not in repr(s) and SECRET not in json.dumps(s.model_dump(mode="json"))
        assert mask_secrets(f"librdkafka said: bad password {SECRET}", s) == "librdkafka said: bad password ***"


def test_tasks_keep_their_environment_settings_without_the_connection(monkeypatch, tmp_path):
    monkeypatch.setenv("KAPPA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KAPPA_BOOTSTRAP_SERVERS", "127.0.0.1:9")

    def get(conn_id):
        raise AirflowNotFoundException(f"The conn_id `{conn_id}` isn't defined")

    monkeypatch.setattr(Connection, "get", staticmethod(get))
    with tasks.task_kappa() as k:
        assert k.settings.bootstrap_servers == "127.0.0.1:9"
        assert "sasl.password" not in k.settings.kafka_config
