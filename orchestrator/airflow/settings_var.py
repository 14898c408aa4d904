"""kappa's settings inside Airflow: the worker's environment, or the Airflow Variable `kappa_settings`.

A team points Airflow at its own pipelines, rules and job code in one of two ways:

- the environment of Airflow's processes (`KAPPA_PIPELINES`, `KAPPA_RULES`, `KAPPA_HOME`, ...),
  which `kappa airflow start` sets from kappa's resolved settings; or
- the Variable `kappa_settings` (Admin -> Variables, or `airflow variables set kappa_settings
  '{"pipelines_file": "/repo/pipelines.toml", "rules_location": "/repo/rules"}'`): a JSON
  object of settings by their kappa.toml names. Its values win over the environment's, so an
  operator can repoint a running Airflow without restarting it; the DAG forms (pipelines, the
  rules dropdown) follow at the next parse of the DAG files.

Every DAG reads settings through `airflow_settings()`: the forms at parse time, the tasks when they
run, the asset helpers. The Kafka connection (`orchestrator.airflow.kafka_conn`) is merged over
both, and is where Kafka secrets belong: the Variable refuses `kafka_config` so that no secret sits
in a plain Variable. Outside Airflow (the CLI, tests without Airflow) there is no Variable and the
settings are resolved as the CLI resolves them.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from orchestrator.core.exceptions import ConfigError

__all__ = ["VARIABLE", "airflow_settings", "variable_overrides", "overrides_from_variable"]

VARIABLE = "kappa_settings"

log = logging.getLogger("kappa.airflow")


def overrides_from_variable(value: Any) -> dict[str, Any]:
    """`resolve_settings` overrides from the Variable's value (a JSON object or its text)."""
    from orchestrator.core.settings import CLI_FLAGS

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConfigError(f"Airflow Variable {VARIABLE!r} is not valid JSON ({e.msg} at line {e.lineno} column "
                              f"{e.colno}); set it to an object such as {{\"pipelines_file\": "
                              f"\"/repo/pipelines.toml\"}}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"Airflow Variable {VARIABLE!r} must be a JSON object of kappa settings, got "
                          f"{type(value).__name__}; e.g. {{\"rules_location\": \"/repo/rules\"}}")
    if "kafka_config" in value:
        raise ConfigError(f"Airflow Variable {VARIABLE!r} may not hold kafka_config (Kafka settings can be "
                          f"secrets): put them in the Airflow connection kafka_default's extra")
    unknown = sorted(set(value) - set(CLI_FLAGS))
    if unknown:
        raise ConfigError(f"Airflow Variable {VARIABLE!r}: unknown setting(s) {', '.join(map(repr, unknown))}; "
                          f"known: {', '.join(k for k in CLI_FLAGS if k != 'kafka_config')}")
    return {str(k): None if v is None else str(v) for k, v in value.items()}


def variable_overrides() -> dict[str, Any]:
    """The overrides of the Variable, or {} when it is not set (or no Airflow runs this)."""
    try:
        from airflow.sdk import Variable
    except ImportError:
        return {}
    try:
        value = Variable.get(VARIABLE, default=None)
    except Exception as e:  # no Airflow process to ask (a script, a test): the environment's settings stand
        in_task = bool(os.environ.get("AIRFLOW_CTX_DAG_ID"))
        log.log(logging.WARNING if in_task else logging.DEBUG, "Airflow Variable %r not readable here (%s); "
                "using the environment's kappa settings", VARIABLE, e)
        return {}
    if value is None:
        return {}
    out = overrides_from_variable(value)
    log.info("kappa settings from Airflow Variable %r: %s", VARIABLE, ", ".join(sorted(out)))
    return out


def airflow_settings():
    """kappa's settings as Airflow's DAGs and tasks see them: environment, then the Variable over it,
    then the Kafka connection over both."""
    from orchestrator.airflow.kafka_conn import connection_overrides
    from orchestrator.core.settings import resolve_settings

    from_variable, from_connection = variable_overrides(), connection_overrides()
    sources = {f: f"Airflow Variable {VARIABLE!r}" for f in from_variable}
    sources.update({f: "Airflow connection (Kafka)" for f in from_connection})
    return resolve_settings(override_sources=sources, **{**from_variable, **from_connection})
