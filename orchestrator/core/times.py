"""Points in time as kappa stores them: Unix seconds (floats), whatever form they arrive in; and
the one way kappa shows one to a person (`utc_clock`)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, Literal

__all__ = ["to_seconds", "utc_clock"]


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


def utc_clock(at: float | None, *, date: Literal["always", "never", "unless today"] = "always",
              now: float | None = None) -> str:
    """`at` (Unix seconds) as a UTC wall clock for messages: '2025-05-01 12:05:01 UTC'; '?' for None.

    `date="never"` leaves the date out ('12:05:01 UTC'); `date="unless today"` leaves it out when `at`
    falls on today's UTC date (`now`, default the current time, says which day that is).
    """
    if at is None:
        return "?"
    t = datetime.fromtimestamp(at, timezone.utc)
    if date == "never":
        with_date = False
    elif date == "unless today":
        with_date = t.date() != datetime.fromtimestamp(time.time() if now is None else now, timezone.utc).date()
    elif date == "always":
        with_date = True
    else:
        raise ValueError(f"date must be 'always', 'never' or 'unless today', not {date!r}")
    return t.strftime("%Y-%m-%d %H:%M:%S UTC" if with_date else "%H:%M:%S UTC")
