"""Points in time as kappa stores them: Unix seconds (floats), whatever form they arrive in."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

__all__ = ["to_seconds"]


def to_seconds(value: Any) -> float | None:
    """Unix seconds of a datetime (naive means UTC), a number or an ISO string; None if it is none of them."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.timestamp()
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return to_seconds(datetime.fromisoformat(str(value)))
    except ValueError:
        return None
