"""Waiting on a condition instead of sleeping: a bounded poll that fails the test, naming what it
expected and what it last saw, when the condition never holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_until(probe: Callable[[], T], what: str, timeout: float, poll: float = 0.2,
               done: Callable[[T], bool] = bool) -> T:
    """Call `probe` every `poll` seconds until `done(value)`; return that value.

    After `timeout` seconds pytest.fail names `what` was expected and the last value seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"expected {what} within {timeout:.0f} s; last seen: {value!r}")
        time.sleep(poll)
