"""Checks and conversions of the values the registry stores (shared by its query modules)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from orchestrator.core.exceptions import RegistryError
from orchestrator.core.states import ALL as ALL_STATES
from orchestrator.core.states import VersionState
from orchestrator.core.times import utc_clock

__all__ = ["SET_STATE_FIELDS", "STANDBY_KEYS", "changed_by", "check_actor", "check_state", "field_values", "plain_json",
           "render_for_version", "unix_seconds"]

#: What `set_state` may change besides the state.
SET_STATE_FIELDS = ("pid", "run_dir", "rejects_path", "error", "started_at", "stopped_at", "caught_up_at",
                    "details")
_TIME_FIELDS = ("started_at", "stopped_at", "caught_up_at")
#: The keys of a version's details that hold while it is a standby (dropped when it serves again):
#: when it became one, and when its grace period ends (written when the flip knew the grace).
STANDBY_KEYS = ("standby_since", "standby_until")


def field_values(fields: dict[str, Any]) -> dict[str, Any]:
    """The column values of a version's fields besides its state, checked and converted."""
    unknown = sorted(set(fields) - set(SET_STATE_FIELDS))
    if unknown:
        raise RegistryError(f"cannot change {', '.join(unknown)} of a version; only "
                            f"{', '.join(SET_STATE_FIELDS)}")
    values: dict[str, Any] = {}
    for name, value in fields.items():
        if name in _TIME_FIELDS and value is not None:
            value = unix_seconds(value, name)
        elif name == "details":
            value = plain_json(value or {}, "version details")
        elif name in ("run_dir", "rejects_path") and value is not None:
            value = str(value)
        values[name] = value
    return values


# -- helpers ------------------------------------------------------------------------------------

def unix_seconds(value: Any, what: str) -> float:
    """Unix seconds of a number or a datetime (naive means UTC); RegistryError naming `what` otherwise."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise RegistryError(f"{what} must be unix seconds or a datetime, got {value!r}")


def plain_json(value: Any, what: str) -> Any:
    """Round-trip through JSON so the database gets plain data (datetimes and paths become text)."""
    if value is None:
        return None
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError) as e:
        raise RegistryError(f"{what} must be JSON-serializable: {e}") from None


def check_actor(actor: Any) -> str:
    """Who asked for a change, stripped and at most 200 characters; RegistryError if there is no one."""
    if not isinstance(actor, str) or not actor.strip():
        raise RegistryError("every registry change needs an actor (who asked for it), e.g. a user name "
                            "or 'airflow:<dag>/<run>'")
    return actor.strip()[:200]


def check_state(state: Any, what: str = "state") -> str:
    """The state's plain value, or RegistryError naming the states there are."""
    if state not in ALL_STATES:
        raise RegistryError(f"unknown version {what} {state!r}; states are {', '.join(ALL_STATES)}")
    return VersionState(state).value


def render_for_version(value: Any, n: int, what: str) -> str | None:
    """A version's path or name: `value(n)` if it is callable, with `{n}` and `{version}` replaced by `n`."""
    if value is None:
        return None
    if callable(value):
        value = value(n)
    text = str(value)
    return text.replace("{n}", str(n)).replace("{version}", str(n))


def changed_by(actor: str | None, reason: str | None, at: float | None) -> str:
    """'by alice at 2025-05-01 12:05:01 UTC (reason: ...)', for messages about who changed a row."""
    text = f"by {actor or '?'} at {utc_clock(at)}"
    return f"{text} (reason: {reason!r})" if reason else text
