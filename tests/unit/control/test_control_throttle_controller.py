"""Issue 32, part 2: the adaptive share controller against a fake lag signal, and the share -> nice map.

The controller is pure: these tests feed it a lag signal (a script, or a plant whose lag answers the
share) and check its promises: it backs off while the serving version lags over the bound, recovers
once the lag is under half of it, never goes under the floor (a backfill always moves) nor over the
ceiling, holds on unknown lag and between the two marks, and never changes twice within its interval.
"""

from __future__ import annotations

import math

import pytest

from orchestrator.core.shares import MAX_NICE, MIN_SHARE, check_share, nice_to_share, share_to_nice
from orchestrator.observe.throttle import ShareController

BOUND, INTERVAL = 5.0, 5.0


def run(ctl: ShareController, signal, *, share: float = 1.0, start: float = 1000.0, step: float = 1.0):
    """Feed `signal(t, share)` (the serving lag) to the controller every `step` s; [(t, share, changed)]."""
    changed_at = None
    out = []
    t = start
    for _ in range(signal.steps):
        d = ctl.step(t, signal(t, share), share, changed_at)
        if d.changed:
            changed_at = t
        share = d.share
        out.append((t, share, d.changed))
        t += step
    return out


class Script:
    """A lag signal given as a list, one value per step."""

    def __init__(self, values):
        self.values, self.steps, self.i = list(values), len(values), 0

    def __call__(self, t, share):
        v = self.values[self.i]
        self.i += 1
        return v


def test_it_backs_off_multiplicatively_while_the_serving_lag_is_over_the_bound_and_not_below_the_floor():
    ctl = ShareController(bound_seconds=BOUND, interval_seconds=INTERVAL)
    trace = run(ctl, Script([12.3] * 60))
    changes = [s for _, s, c in trace if c]
    assert changes[:4] == [0.5, 0.25, 0.125, 0.0625]
    assert changes[-1] == MIN_SHARE and min(s for _, s, _ in trace) == MIN_SHARE
    d = ctl.step(10_000.0, 12.3, MIN_SHARE, 0.0)
    assert (d.share, d.changed) == (MIN_SHARE, False) and "smallest share" in d.why
    first = ctl.step(0.0, 12.3, 1.0, None)
    assert first.why == "serving lag 12.3 s > bound 5 s"


def test_it_recovers_gradually_once_the_lag_is_under_half_the_bound_up_to_the_ceiling():
    ctl = ShareController(bound_seconds=BOUND, interval_seconds=INTERVAL, ceiling=0.8)
    trace = run(ctl, Script([1.0] * 60), share=MIN_SHARE)
    changes = [s for _, s, c in trace if c]
    assert changes[0] == pytest.approx(MIN_SHARE + 0.1)
    assert all(b - a == pytest.approx(0.1) for a, b in zip(changes, changes[1:-1]))   # additive steps
    assert changes[-1] == 0.8 and max(s for _, s, _ in trace) == 0.8                  # never over the ceiling


def test_it_holds_between_half_the_bound_and_the_bound_and_on_unknown_lag():
    ctl = ShareController(bound_seconds=BOUND, interval_seconds=INTERVAL)
    for lag in (2.5, 3.0, 5.0, None):
        d = ctl.step(100.0, lag, 0.4, None)
        assert (d.share, d.changed) == (0.4, False), lag
    assert "unknown" in ctl.step(100.0, None, 0.4, None).why


def test_a_share_over_a_lowered_ceiling_comes_down_to_it():
    d = ShareController(bound_seconds=BOUND, ceiling=0.5).step(100.0, 0.0, 1.0, None)
    assert (d.share, d.changed) == (0.5, True)


def test_it_never_changes_twice_within_its_interval_even_on_a_signal_that_flips_every_second():
    ctl = ShareController(bound_seconds=BOUND, interval_seconds=INTERVAL)
    flapping = Script([20.0 if i % 2 else 0.0 for i in range(200)])
    trace = run(ctl, flapping, share=0.5)
    times = [t for t, _, c in trace if c]
    assert len(times) >= 10                                          # it did act
    assert all(b - a >= INTERVAL for a, b in zip(times, times[1:])), times
    assert ctl.step(1000.0, 50.0, 0.5, 1000.0 - INTERVAL + 0.01).changed is False
    assert ctl.step(1000.0, 50.0, 0.5, 1000.0 - INTERVAL).changed is True


class Plant:
    """A serving version whose lag grows while the backfill takes more than 0.3 of the machine and
    shrinks otherwise: the controller should bring the lag under the bound and keep the backfill moving."""

    def __init__(self, steps):
        self.steps, self.lag = steps, 0.0

    def __call__(self, t, share):
        self.lag = max(0.0, self.lag + (1.0 if share > 0.3 else -1.5))
        return self.lag


def test_against_a_plant_it_keeps_the_serving_lag_bounded_and_the_backfill_moving():
    ctl = ShareController(bound_seconds=BOUND, interval_seconds=INTERVAL)
    plant = Plant(600)
    trace = run(ctl, plant)
    shares = [s for _, s, _ in trace]
    assert min(shares) >= MIN_SHARE and max(shares) <= 1.0
    assert any(s < 0.3 for s in shares) and any(s > 0.3 for s in shares[100:])   # backed off, then rose again
    times = [t for t, _, c in trace if c]
    assert all(b - a >= INTERVAL for a, b in zip(times, times[1:]))
    assert plant.lag < 4 * BOUND


def test_the_controller_refuses_nonsense_settings():
    for kw in ({"floor": 0.0}, {"ceiling": 1.5}, {"bound_seconds": 0.0}, {"decrease": 1.0}, {"floor": 0.6, "ceiling": 0.5}):
        with pytest.raises(ValueError):
            ShareController(**{"bound_seconds": BOUND, **kw})


def test_share_maps_to_nice_by_the_cfs_weight_ratio():
    assert [share_to_nice(s) for s in (1.0, 0.9, 0.5, 0.25, 0.1, 0.05, MIN_SHARE)] == [0, 0, 3, 6, 10, 13, MAX_NICE]
    for nice in range(MAX_NICE + 1):             # every nice value is reached, and maps back
        assert share_to_nice(max(MIN_SHARE, nice_to_share(nice))) == nice
    shares = [i / 1000 for i in range(15, 1001)]
    nices = [share_to_nice(s) for s in shares]
    assert nices == sorted(nices, reverse=True)  # a smaller share never gets a higher priority
    assert math.isclose(nice_to_share(3), 1024 / 1.25 ** 3 / 1024)


@pytest.mark.parametrize("bad, words", [(0, "in (0, 1]"), (-0.2, "in (0, 1]"), (1.5, "in (0, 1]"),
                                        (0.001, "smallest share"), (float("nan"), "a number"), (True, "a number")])
def test_a_share_outside_its_range_is_refused_naming_the_range(bad, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        check_share(bad)
