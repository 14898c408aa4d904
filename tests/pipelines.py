"""The `pipelines.toml` block of a test's standardize pipeline, written once for every test that needs one.

Defaults are what the integration tests want: a version is ready after two samples at lag 0, an
hour of standby grace (so a standby stays for the rollback the test makes), two versions kept, and
the test data's share of malformed records allowed. A test passes what it needs otherwise.
"""

from __future__ import annotations

__all__ = ["standardize_pipeline"]


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
