"""Kafka settings from an Airflow Connection, so credentials live in Airflow's secrets backend.

The apache-kafka provider's convention: a connection (`kafka_default` unless
`KAPPA_AIRFLOW_KAFKA_CONN_ID` names another) whose *extra* is a JSON object of librdkafka
settings, `bootstrap.servers` among them. kappa's tasks read it when it is defined:

- `bootstrap.servers` (or else the connection's host and port) becomes `bootstrap_servers`;
- every other key becomes `kafka_config`, merged over `KAPPA_KAFKA_CONFIG` key by key;
- the connection's login and password, when set, become `sasl.username` / `sasl.password`
  unless the extra sets those;
- consumer settings kappa manages itself (`group.id`, `enable.auto.commit`, ...) are dropped.

When no such connection is defined, the tasks keep the settings `kappa airflow start` gave them
(KAPPA_* environment). The CLI never reads Airflow connections; it keeps its own settings.
The values are secrets: they reach a job only through its 0600 `kafka.json`, and kappa masks
them in everything it logs (Airflow's own log masker hides the connection's password too).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from orchestrator.core.envvars import KAPPA_AIRFLOW_KAFKA_CONN_ID
from orchestrator.core.exceptions import ConfigError

__all__ = ["CONN_ID_ENV", "DEFAULT_CONN_ID", "MANAGED_KEYS", "connection_overrides", "overrides_from"]

CONN_ID_ENV = KAPPA_AIRFLOW_KAFKA_CONN_ID
DEFAULT_CONN_ID = "kafka_default"
#: Consumer settings kappa sets per job and version; a connection's value would break them.
MANAGED_KEYS = frozenset({"group.id", "enable.auto.commit", "auto.offset.reset", "enable.partition.eof",
                          "isolation.level"})

log = logging.getLogger("kappa.airflow")


def overrides_from(conn_id: str, *, extra: dict[str, Any] | None, host: str | None = None,
                   port: int | None = None, login: str | None = None,
                   password: str | None = None) -> dict[str, Any]:
    """`resolve_settings` overrides (bootstrap_servers, kafka_config) from a connection's fields."""
    if extra is not None and not isinstance(extra, dict):
        raise ConfigError(f"the extra of Airflow connection {conn_id!r} must be a JSON object of librdkafka "
                          f"settings, e.g. {{\"bootstrap.servers\": \"broker:9092\"}}")
    config = {str(k): v for k, v in (extra or {}).items() if str(k) not in MANAGED_KEYS}
    servers = config.pop("bootstrap.servers", None)
    if not servers and host:
        servers = f"{host}:{port}" if port else host
    if not servers:
        raise ConfigError(f"Airflow connection {conn_id!r} names no Kafka broker: put \"bootstrap.servers\" in "
                          f"its extra (or set its host and port)")
    if login and "sasl.username" not in config:
        config["sasl.username"] = login
    if password and "sasl.password" not in config:
        config["sasl.password"] = password
    return {"bootstrap_servers": str(servers), "kafka_config": config}


def connection_overrides(conn_id: str | None = None) -> dict[str, Any]:
    """The overrides from the Kafka connection, or {} when it is not defined (or no Airflow runs this)."""
    conn_id = conn_id or os.environ.get(CONN_ID_ENV) or DEFAULT_CONN_ID
    try:
        from airflow.sdk import Connection
        from airflow.sdk.exceptions import AirflowNotFoundException
    except ImportError:
        return {}
    try:
        conn = Connection.get(conn_id)
    except AirflowNotFoundException:
        log.debug("no Airflow connection %r: using the settings kappa airflow start gave", conn_id)
        return {}
    out = overrides_from(conn_id, extra=conn.extra_dejson, host=conn.host, port=conn.port, login=conn.login,
                         password=conn.password)
    log.info("Kafka settings from Airflow connection %r: bootstrap servers %s, %d librdkafka settings",
             conn_id, out["bootstrap_servers"], len(out["kafka_config"]))
    return out
