"""A backfill's share of the machine, and the process priority (nice value) that gives it.

A share is the CPU weight a backfilling version's job gets relative to a job at full share, in
(0, 1]. On one machine the lever is Linux's scheduler weight: CFS gives a thread of nice value n
the weight 1024 / 1.25**n, so two busy threads, one at nice 0 and one at nice n, split a core in
the ratio 1 : 1.25**-n. kappa maps a share s to the nice value whose weight ratio is nearest to
it, ``n = round(log(1/s) / log(1.25))``, clamped to the range the kernel allows for lowering
priority, 0..19: share 1.0 is nice 0, 0.5 is nice 3, 0.1 is nice 10, and `MIN_SHARE` (0.015, the
ratio of nice 19, 1.25**-19 = 0.0144) is nice 19. A share is never 0: a backfill always moves.
"""

from __future__ import annotations

import math

__all__ = ["MIN_SHARE", "MAX_NICE", "NICE_STEP", "share_to_nice", "nice_to_share", "check_share"]

#: The CFS weight ratio of one nice step (the kernel's sched_prio_to_weight table, about 1.25).
NICE_STEP = 1.25
#: The lowest priority an unprivileged process may set.
MAX_NICE = 19
#: The smallest share: nice 19 (1.25**-19 = 0.0144, rounded up so that it maps to 19).
MIN_SHARE = 0.015


def share_to_nice(share: float) -> int:
    """The nice value (0..19) whose CFS weight relative to nice 0 is nearest to `share` (see the module)."""
    share = check_share(share)
    return max(0, min(MAX_NICE, round(math.log(1.0 / share) / math.log(NICE_STEP))))


def nice_to_share(nice: int) -> float:
    """The CFS weight of `nice` relative to nice 0 (the inverse of `share_to_nice` on whole steps)."""
    return NICE_STEP ** -max(0, min(MAX_NICE, int(nice)))


def check_share(share: object, *, what: str = "share") -> float:
    """`share` as a float in [MIN_SHARE, 1]; ValueError naming the range otherwise."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share):
        raise ValueError(f"{what} must be a number in (0, 1], got {share!r}")
    if share <= 0 or share > 1:
        raise ValueError(f"{what} must be in (0, 1] (1 = all of it), got {share:g}")
    if share < MIN_SHARE:
        raise ValueError(f"{what} {share:g} is under the smallest share {MIN_SHARE:g} (nice {MAX_NICE}); "
                         f"a backfill never stops")
    return float(share)
