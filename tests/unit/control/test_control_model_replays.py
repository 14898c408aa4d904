"""Sequences the control-plane model found, replayed step by step through the same model (its
invariants checked after every step), so that each stays covered whatever Hypothesis draws.

1. A rollback cut off between its flip and its publish, rerun: the rerun finishes it (publishes
   the version flipped to, flips nothing). The model's "a rollback moves the alias" check took
   that for a rollback that did nothing (RollbackStayed); readers do move, from the published
   version to the flipped one.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings, strategies as st

from test_control_model import machine


def replay(url_for, steps) -> None:
    """Run `steps` (rule name, kwargs) on a fresh model; a violated invariant raises."""
    root = Path(tempfile.mkdtemp(prefix="kappa-replay-"))
    state = machine(root, url_for)()
    try:
        state.begin(start="serving+ready")
        for name, kwargs in steps:
            getattr(state, name)(**kwargs)
    finally:
        state.teardown()
        shutil.rmtree(root, ignore_errors=True)


ROLLBACK_RERUN_AFTER_CRASH = (
    [("rollback", {"crash": None, "i": 0}),        # v2 serves, v1 previous
     ("rollback", {"crash": None, "i": None}),     # back to v1, v2 previous
     ("rollback", {"crash": 2, "i": None}),        # cut off at rollback.flipped: v2 flipped, v1 published
     ("rollback", {"crash": None, "i": None})])    # finishes it: v2 published


@settings(max_examples=1, deadline=None, database=None)   # the model notes its steps: inside a Hypothesis test
@given(st.just(None))
def test_a_rerun_rollback_that_finishes_a_cut_off_rollback_keeps_every_invariant(_):
    replay(lambda d: f"sqlite:///{d / 'registry.db'}", ROLLBACK_RERUN_AFTER_CRASH)
