"""A test's waits end before its own bound does (tests/waiting.py, tests/conftest.py): a condition that never
holds fails in `wait_until`, naming it and the last value seen, not in pytest-timeout, which names neither
(a broker-kill test waited for the oracle as long as its bound, and its failure said only "Timeout")."""

from __future__ import annotations

import time

import pytest

from tests import waiting
from tests.conftest import bound_of
from tests.waiting import FLOOR, MARGIN, bound_test, time_left, wait_until


@pytest.mark.timeout(20)
def test_a_wait_longer_than_what_is_left_of_the_test_fails_in_time_naming_its_last_value(monkeypatch):
    # the test started long enough ago that its bound, less the margin, is over: the 900 s wait gets FLOOR seconds
    monkeypatch.setattr(waiting, "FLOOR", 0.3)   # (5 s in the suite: not worth waiting for here)
    bound_test(1000, now=time.monotonic() - 1000)
    with pytest.raises(pytest.fail.Exception) as failed:
        wait_until(lambda: (False, "rejects schema differs: batch_id is int64 not null, expected int64"),
                   "v1's table to equal the oracle", 900, poll=0.05, done=lambda r: r[0])
    said = str(failed.value)
    assert "within 0 s (of 900 s: the rest of the test's own bound)" in said, said
    assert "rejects schema differs: batch_id is int64 not null" in said, said


def test_what_is_left_is_the_bound_less_the_margin_and_never_more_than_asked():
    bound_test(1000, now=time.monotonic())
    assert 1000 - MARGIN - 1 <= time_left(2000) <= 1000 - MARGIN
    assert time_left(30) == 30
    bound_test(100, now=time.monotonic())      # a short bound keeps a tenth of itself, not the whole margin
    assert 89 <= time_left(900) <= 90
    bound_test(None)
    assert time_left(900) == 900
    bound_test(0)
    assert time_left(900) == 900
    bound_test(1000, now=time.monotonic() - 1000)   # nothing left: a short wait still gets FLOOR, or its own timeout
    assert (time_left(900), time_left(2)) == (FLOOR, 2)


@pytest.mark.timeout(1234)
def test_each_test_gets_its_own_marker_bound_from_its_set_up(request):
    assert bound_of(request.node) == 1234
    # tests/conftest.py set it when this test's set-up began, as pytest-timeout's timer starts then
    assert 1234 - MARGIN - 60 < waiting._test_ends - time.monotonic() <= 1234 - MARGIN


def test_a_test_without_a_marker_gets_the_suites_bound(request):
    assert bound_of(request.node) == float(request.config.getoption("timeout", None) or
                                           request.config.getini("timeout"))
    assert waiting._test_ends is not None
