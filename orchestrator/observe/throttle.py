"""The adaptive share controller: a backfill yields while the serving version falls behind.

Pure and small: fed the time and the serving version's lag in seconds (None when unknown), with
the share in force and when it last changed, it returns a `Decision`. The state lives with the
caller (the registry's `details["throttle"]`, `orchestrator.lifecycle.throttle`), so a supervisor
that restarts continues where the last one left off.

- lag over `bound_seconds`: multiplicative decrease (the share times `decrease`, 0.5), never
  under `floor` (`orchestrator.core.shares.MIN_SHARE`: a backfill always moves);
- lag under `recover_below` times the bound (half of it): additive increase (plus `increase`,
  0.1), never over `ceiling` (the pipeline's `backfill_share`); between the two: hold
  (hysteresis, so that a lag hovering at the bound does not flap the share);
- lag unknown: hold (unknown is never taken for good or bad news);
- at most one change per `interval_seconds`, counted from the last change, whoever made it;
- a share over the ceiling (the pipeline's setting was lowered) comes down to it at the next
  change allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.core.shares import MIN_SHARE

__all__ = ["Decision", "ShareController"]


@dataclass(frozen=True)
class Decision:
    """What one step decided: the share from now on, whether it changed, and why, in words."""

    share: float
    changed: bool
    why: str


@dataclass(frozen=True)
class ShareController:
    bound_seconds: float
    interval_seconds: float = 5.0
    ceiling: float = 1.0
    floor: float = MIN_SHARE
    decrease: float = 0.5
    increase: float = 0.1
    recover_below: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.floor <= self.ceiling <= 1:
            raise ValueError(f"the shares must satisfy 0 < floor <= ceiling <= 1, got floor {self.floor:g}, "
                             f"ceiling {self.ceiling:g}")
        if self.bound_seconds <= 0 or self.interval_seconds <= 0:
            raise ValueError("the lag bound and the interval must be > 0 seconds")
        if not 0 < self.decrease < 1 or self.increase <= 0 or not 0 < self.recover_below <= 1:
            raise ValueError("decrease must be in (0, 1), increase > 0, recover_below in (0, 1]")

    def step(self, now: float, lag_seconds: float | None, share: float, changed_at: float | None) -> Decision:
        """One decision for a backfill at `share` (last changed at `changed_at`, None: never) given the
        serving version's `lag_seconds` at `now`."""
        if changed_at is not None and now - changed_at < self.interval_seconds:
            return Decision(share, False, f"holding: last change {now - changed_at:.1f} s ago, "
                                          f"at most one every {self.interval_seconds:g} s")
        if share > self.ceiling:
            return Decision(self.ceiling, True, f"down to the pipeline's backfill_share {self.ceiling:g}")
        if lag_seconds is None:
            return Decision(share, False, "holding: the serving version's lag is unknown")
        bound = self.bound_seconds
        if lag_seconds > bound:
            new = max(self.floor, round(share * self.decrease, 4))
            if new >= share:
                return Decision(share, False, f"at the smallest share {self.floor:g}: serving lag "
                                              f"{lag_seconds:.1f} s > bound {bound:g} s")
            return Decision(new, True, f"serving lag {lag_seconds:.1f} s > bound {bound:g} s")
        low = bound * self.recover_below
        if lag_seconds < low and share < self.ceiling:
            new = min(self.ceiling, round(share + self.increase, 4))
            return Decision(new, True, f"serving lag {lag_seconds:.1f} s < {low:g} s (half the bound {bound:g} s)"
                            if self.recover_below == 0.5 else f"serving lag {lag_seconds:.1f} s < {low:g} s")
        return Decision(share, False, f"holding: serving lag {lag_seconds:.1f} s"
                                      + ("" if share < self.ceiling else f", at the ceiling {self.ceiling:g}"))
