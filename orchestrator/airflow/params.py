"""The DAG forms: the Params kappa's DAG files share, and what they read when Airflow parses them.

Everything here runs at parse time, every time the dag-processor reads a DAG file: it reads the
pipelines file and lists rules files (no Spark). An invalid pipelines file raises ConfigError, which
Airflow shows as the DAG's import error. With `estimates` (kappa_reprocess's form) it also estimates each
pipeline's backfill for its dropdown label, from the registry and the log offsets, within a few seconds
in all and "unknown" with the reason when the broker does not answer (`orchestrator.airflow.estimates`).

Deadlines are seconds in the library; the forms show them in minutes, and `deadline_at` is the one
place a form's minutes become seconds.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from airflow.sdk import Param

from orchestrator.core.envvars import KAPPA_AIRFLOW_POKE_SECONDS
from orchestrator.core.settings import Settings

__all__ = ["POKE_SECONDS_ENV", "SENSOR_MODE", "MIN_POKE_SECONDS", "poke_seconds", "form_choices", "pipeline_param",
           "reason_param", "grace_period_param", "deadline_minutes_param", "deadline_at"]

#: Seconds between two pokes of the sensors (read at parse time; the tests shorten it).
POKE_SECONDS_ENV = KAPPA_AIRFLOW_POKE_SECONDS
#: The sensors' mode: "poke", one task process that pokes until done, holding one executor slot while it
#: waits. Not "reschedule": there Airflow 3.3's scheduler can drain the executor's success of one poke
#: after it queued the next poke of the same try, and it then fails the sensor ("finished with state
#: success, but the task instance's state attribute is queued": apache/airflow#71172, open); a busy
#: machine makes the late drain likely and every poke is a chance, so a reprocess waiting out a long
#: backfill failed for nothing (kappa up's walk in CI). The test: tests/integration/airflow/test_airflow_sensor_race.py.
SENSOR_MODE = "poke"
#: The shortest poke interval: a poke samples the lag (the broker's offsets and the registry), a few
#: hundred milliseconds of work.
MIN_POKE_SECONDS = 2.0
#: The form param holding a run's catch-up deadline, in minutes.
DEADLINE_PARAM = "catchup_deadline_minutes"


def poke_seconds(default: float = 15.0) -> float:
    """The sensors' poke interval: KAPPA_AIRFLOW_POKE_SECONDS, at least MIN_POKE_SECONDS."""
    try:
        value = float(os.environ.get(POKE_SECONDS_ENV) or default)
    except ValueError:
        value = default
    return max(MIN_POKE_SECONDS, value)


def form_choices(settings: Settings | None = None, *, estimates: bool = False) -> dict[str, Any]:
    """Choices for the DAG forms: declared pipelines and available rules versions (and with `estimates`,
    each pipeline's label with its backfill estimate)."""
    from jobs.lib.rules.files import available_rules
    from orchestrator.core.pipelines import load_pipelines
    from orchestrator.airflow.settings_var import airflow_settings

    settings = settings or airflow_settings()
    specs = load_pipelines(settings.pipelines_file)
    rules = {name: available_rules(spec.ruleset, settings.rules_location)
             for name, spec in specs.items() if spec.ruleset}
    labels: dict[str, list[str]] = {}  # rules version -> the rulesets that have it
    for name, versions in rules.items():
        for v in versions:
            if specs[name].ruleset not in labels.setdefault(v, []):
                labels[v].append(specs[name].ruleset)
    pipelines = list(specs)
    return {
        "pipelines": pipelines,
        "default_pipeline": "standardize" if "standardize" in specs else (pipelines[0] if pipelines else None),
        "rules_versions": list(labels),
        "rules_labels": {v: f"{v} ({', '.join(sorted(rs))})" for v, rs in labels.items()},
        "rules_by_pipeline": rules,
        "pipelines_file": str(settings.pipelines_file),
        "pipeline_labels": _estimate_labels(settings, specs) if estimates else {},
    }


def _estimate_labels(settings: Settings, specs: Mapping[str, Any]) -> dict[str, str]:
    from orchestrator.airflow.estimates import form_estimates

    return form_estimates(settings, specs)


def pipeline_param(choices: Mapping[str, Any]) -> Param:
    """A dropdown of the pipelines declared in the pipelines file."""
    labels = choices.get("pipeline_labels") or {}
    extra = {"values_display": labels} if labels else {}
    estimate = (" Each choice shows its backfill estimate (log size at most, at the rate an earlier version measured "
                "or a default; as of the form's last parse)." if labels else "")
    return Param(choices["default_pipeline"], type="string", enum=choices["pipelines"], title="Pipeline",
                 description=f"Declared in {choices['pipelines_file']}.{estimate}", **extra)


def reason_param() -> Param:
    """The required reason, recorded in kappa's audit log with the Airflow user and the run."""
    return Param(type="string", minLength=3, maxLength=500, title="Reason",
                 description="Why (required): recorded in kappa's audit log with your Airflow user and this run.")


def grace_period_param() -> Param:
    """How long the version a promote replaces stays a running standby (instant rollback)."""
    return Param(None, type=["null", "integer"], minimum=0, title="Standby grace period (s)",
                 description="How long the version the promote replaces keeps running; empty: the pipeline's "
                             "grace_period_seconds (kappa_monitor, when on, stops standbys after that one).")


def deadline_minutes_param(default_seconds: float, description: str) -> Param:
    """The run's catch-up deadline in minutes, defaulting to a verb's deadline in seconds."""
    return Param(round(default_seconds / 60), type="integer", minimum=1, title="Catch-up deadline (minutes)",
                 description=description)


def deadline_at(dag_run: Any, params: Mapping[str, Any]) -> float:
    """Unix time at which the run's catch-up deadline (`catchup_deadline_minutes` after its start) passes."""
    return dag_run.start_date.timestamp() + params[DEADLINE_PARAM] * 60.0
