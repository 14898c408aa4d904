"""Waiting on a condition instead of sleeping: a bounded poll that fails the test, naming what it
expected and what it last saw, when the condition never holds.

A wait never outlasts the running test's own bound (pytest-timeout's, set for each test by
`tests/conftest.py` through `bound_test`) less `MARGIN`: a condition that never holds fails the test in
`wait_until`, which names it and its last value, instead of in pytest-timeout, which names neither (a
broker-kill test's wait for the oracle was as long as its bound, and its failure said only "Timeout")."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

#: Seconds a test keeps of its bound for the failure's report and its teardown (stopping jobs and brokers);
#: a tenth of the bound when that is less.
MARGIN = 60.0
#: When the running test's bound ends, less `MARGIN` (`time.monotonic()`), or None: no bound.
_test_ends: float | None = None


def bound_test(seconds: float | None, *, now: float | None = None) -> None:
    """The running test has `seconds` (None or 0: no bound) from `now` (default: this moment)."""
    global _test_ends
    start = time.monotonic() if now is None else now
    _test_ends = start + seconds - min(MARGIN, seconds / 10) if seconds else None


#: A wait gets at least this long (or its own `timeout`, if shorter), however little is left: a teardown's
#: short wait near the end of a long test still gets its chance, within the margin.
FLOOR = 5.0


def time_left(timeout: float) -> float:
    """`timeout`, or less: what is left of the running test's bound (less the margin), never below `FLOOR`
    (or `timeout`, if shorter)."""
    if _test_ends is None:
        return timeout
    return min(timeout, max(FLOOR, _test_ends - time.monotonic()))


def wait_until(probe: Callable[[], T], what: str, timeout: float, poll: float = 0.2,
               done: Callable[[T], bool] = bool) -> T:
    """Call `probe` every `poll` seconds until `done(value)`; return that value.

    After `timeout` seconds, or sooner when the test's own bound is nearer (`time_left`), pytest.fail
    names `what` was expected and the last value seen.
    """
    limit = time_left(timeout)
    deadline = time.monotonic() + limit
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() >= deadline:
            bound = "" if limit >= timeout else f" (of {timeout:.0f} s: the rest of the test's own bound)"
            pytest.fail(f"expected {what} within {limit:.0f} s{bound}; last seen: {value!r}")
        time.sleep(poll)
