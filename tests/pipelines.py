"""The `pipelines.toml` block of a test's standardize pipeline, written once for every test that needs one,
and the shipped pipelines file made patient for the walks (`patient_pipelines_file`).

Defaults are what the integration tests want: a version is ready after two samples at lag 0, an
hour of standby grace (so a standby stays for the rollback the test makes), two versions kept, and
the test data's share of malformed records allowed. A test passes what it needs otherwise.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["patient_pipelines_file", "standardize_pipeline"]


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def standardize_pipeline(pipeline: str, topic: str, *, alias: str | None = None, **overrides) -> str:
    """`[pipelines.<pipeline>]` of a standardize job over `topic`; `overrides` set or replace keys
    (a None value leaves the key out)."""
    keys = {"job": "standardize", "topics": [topic], "key": "member_id", "ruleset": "titles",
            "alias": alias or f"{pipeline}_served", "catchup_threshold": 0, "catchup_samples": 2,
            "grace_period_seconds": 3600, "keep_versions": 2, "max_reject_rate": 0.05}
    keys.update(overrides)
    lines = [f"[pipelines.{pipeline}]"]
    for name, value in keys.items():
        if value is None:
            continue
        shown = "[" + ", ".join(_toml(v) for v in value) + "]" if isinstance(value, list) else _toml(value)
        lines.append(f"{name} = {shown}")
    return "\n".join(lines) + "\n"


def patient_pipelines_file(path: Path) -> Path:
    """`deploy/pipelines.toml` with standardize's catchup_seconds at 600 and its backfill_lag_bound_seconds
    at 600, written to `path`: for the walks (`kappa demo`, `kappa up`) that run a live producer beside
    other jobs and then need "ready". Under the whole suite on 2 cores a live micro-batch has taken 40-60 s,
    so the oldest unprocessed record was over 60 s old and a version never got ready (CI, 2026-11-29), and
    the serving version, 50-80 s behind, made the adaptive share hold a new version's backfill at nice 19
    for minutes (2026-11-30). These walks test the screens and the story, not readiness' limits
    (test_control_promote, test_control_lag_seconds do) nor the backfill's yielding
    (test_control_backfill_yields does)."""
    from orchestrator.core.resources import default_pipelines_file

    text = default_pipelines_file().read_text(encoding="utf-8")
    for line, patient in (("catchup_seconds = 60 ", "catchup_seconds = 600"),
                          ("backfill_lag_bound_seconds = 10 ", "backfill_lag_bound_seconds = 600")):
        assert text.count(line) == 1 and text.index("[pipelines.standardize]") < text.index(line), line
        text = text.replace(line, patient)
    path.write_text(text, encoding="utf-8")
    return path
