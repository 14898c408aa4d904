"""Sequences the control-plane model found, or that force one of its crash windows, replayed step
by step through the same model (its invariants checked after every step), so that each stays
covered whatever Hypothesis draws.

1. A rollback cut off between its flip and its publish, rerun: the rerun finishes it (publishes
   the version flipped to, flips nothing). The model's "a rollback moves the alias" check took
   that for a rollback that did nothing (RollbackStayed); readers do move, from the published
   version to the flipped one.
2. The watch (issue 21), from v2 promoted and watched with v1 standby (grace period of an hour):
   v2 degrades, and a monitor pass crashes at each crash point of the automatic rollback in turn
   (watch.decided: between the decision and the flip; rollback.flipped: between the flip and the
   publish; ...); the next monitor pass finishes the rollback, publishes and settles it, once.
3. A manual rollback or promote during the watch ends it; a later degrade of v2 rolls nothing back.
4. Product bugs the model found, fixed, replayed: the watch's rollback re-read the alias, so a
   promote that landed between the decision and the flip was rolled back instead
   (AutoRollbackUndecided); a manual rollback to a version rolled back automatically erased its
   mark, so it was promoted again without --force (PromotedAfterAutoRollback).
5. The start state of a replay is reached when jobs start slower than a ready step waits (a busy
   machine): its steps to it wait long enough, and must succeed.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import Phase, example, given, settings, strategies as st

from model_checks import AutoRollbackUndecided, PromotedAfterAutoRollback
from test_control_model import machine

SQLITE = lambda d: f"sqlite:///{d / 'registry.db'}"  # noqa: E731
ONCE = settings(max_examples=1, deadline=None, database=None)   # the model notes its steps: inside a Hypothesis test
#: An expected failure's: its one explicit example only (no patch file of a "failing test case" written).
EXPLICIT = settings(ONCE, phases=[Phase.explicit])


def replay(url_for, steps, *, start: str = "serving+ready", grace: float = 3600.0, then=None,
           start_delay: float = 0.0) -> None:
    """Run `steps` (rule name, kwargs) on a fresh model; a violated invariant raises. `then(state)`
    runs before the teardown (its last reconcile, which checks everything again). Each job takes
    `start_delay` seconds to start."""
    root = Path(tempfile.mkdtemp(prefix="kappa-replay-"))
    state = machine(root, url_for)()
    state.start_delay = start_delay
    try:
        state.begin(start=start, grace=grace)
        for name, kwargs in steps:
            getattr(state, name)(**kwargs)
        if then is not None:
            then(state)
    finally:
        state.teardown()
        shutil.rmtree(root, ignore_errors=True)


def watch(state, v: int) -> dict:
    return (state.world.k.registry.get_version(state.world.pipeline, v).details or {}).get("watch") or {}


def auto_rollbacks(state) -> list:
    return [e for e in state.world.k.registry.audit_log(state.world.pipeline, limit=None, action="flip_alias")
            if e.outcome == "ok" and e.actor == "kappa-watch"]


ROLLBACK_RERUN_AFTER_CRASH = (
    [("rollback", {"crash": None, "i": 0}),        # v2 serves, v1 previous
     ("rollback", {"crash": None, "i": None}),     # back to v1, v2 previous
     ("rollback", {"crash": 2, "i": None}),        # cut off at rollback.flipped: v2 flipped, v1 published
     ("rollback", {"crash": None, "i": None})])    # finishes it: v2 published


@ONCE
@given(st.just(None))
def test_a_rerun_rollback_that_finishes_a_cut_off_rollback_keeps_every_invariant(_):
    replay(SQLITE, ROLLBACK_RERUN_AFTER_CRASH, grace=0.0)


#: The crash points a monitor pass reaches, in order, when the watched v2 has degraded.
WATCH_POINTS = ["watch.decided", "rollback.checked", "rollback.flipped", "rollback.published", "watch.rolled_back",
                "stop.marked"]


@pytest.mark.parametrize("n", range(1, len(WATCH_POINTS) + 1), ids=WATCH_POINTS)
@ONCE
@given(_=st.just(None))
def test_a_monitor_killed_in_the_automatic_rollback_is_finished_by_the_next(n, _):
    def run(state):
        assert watch(state, 2)["state"] == "watching" and watch(state, 2)["standby"] == 1
        state.degrade(then_monitor=False, crash=None)
        out = state._step("monitor", n)   # reconcile gives v2 up; the watch decides and rolls back
        assert out.outcome == "crashed" and out.error == f"crash point {WATCH_POINTS[n - 1]}", out
        state._step("monitor")             # finishes what the crashed pass left
        alias = state.world.k.registry.get_alias(state.world.spec.alias)
        w = watch(state, 2)
        assert (alias.version, alias.published_version) == (1, 1), alias
        assert (w["state"], w.get("settled")) == ("rolled_back", True), w
        # v2 stopped, and recorded so even when the pass was killed after its stop (stop.marked)
        assert state.world.k.registry.get_version(state.world.pipeline, 2).state == "stopped"
        assert w.get("stopped") is True, w
        assert len(auto_rollbacks(state)) == 1
        state._step("monitor")             # nothing more to do: no second rollback
        assert len(auto_rollbacks(state)) == 1 and watch(state, 2)["state"] == "rolled_back"

    replay(SQLITE, [], start="watching", then=run)


@ONCE
@given(st.just(None))
def test_the_watching_start_state_is_reached_when_jobs_start_slower_than_a_ready_step_waits(_):
    """CI: on a busy machine v1's fake job had not run its first batch within the ready step's 1 s, so the
    promote of v1 and then the deploy of v2 (v1 in flight) were refused, and a replay about the watch of v2
    failed with "pipeline 'model49' has no version v2". Forced here: each job takes 1.5 s to start."""
    def run(state):
        alias = state.world.k.registry.get_alias(state.world.spec.alias)
        assert (alias.version, alias.published_version) == (2, 2), alias
        assert watch(state, 2)["state"] == "watching" and watch(state, 2)["standby"] == 1

    replay(SQLITE, [], start="watching", then=run, start_delay=1.5)


@pytest.mark.parametrize("manual", ["rollback", "promote"])
@ONCE
@given(_=st.just(None))
def test_a_manual_flip_during_the_watch_ends_it(manual, _):
    def run(state):
        if manual == "rollback":
            state._step("rollback", v=None)                # back to v1
        else:
            state._step("deploy")
            state._step("ready", v=3)
            state._step("promote", v=3)                    # v3 serves, watched with v2 standby
        assert watch(state, 2)["state"] == "ended", watch(state, 2)
        assert "during the watch" in watch(state, 2)["ended_by"]
        state.degrade(then_monitor=False, crash=None)    # whatever serves now degrades
        state.monitor(crash=None)
        rolled = [(e.details["from_version"], e.details["to_version"]) for e in auto_rollbacks(state)]
        if manual == "rollback":                           # v1 serves unwatched: nothing rolls back
            assert rolled == [] and watch(state, 2)["state"] == "ended"
        else:                                              # v3's own watch rolls it back, to v2
            assert rolled == [(3, 2)] and watch(state, 3)["state"] == "rolled_back"

    replay(SQLITE, [], start="watching", then=run)


@EXPLICIT
@example(None)
@given(st.just(None))
def test_a_promote_between_the_watch_decision_and_its_flip_is_not_rolled_back(_):
    """Found by the model (AutoRollbackUndecided): the watch's rollback re-read the alias, so a promote of
    v3 landing after the decision about v2 was rolled back by kappa-watch instead. Now the rollback is
    abandoned (the flip expects v2) and v2's watch ended by that promote."""
    def run(state):
        state._step("deploy")
        state._step("ready", v=3)
        state.degrade(then_monitor=False, crash=None)    # v2's job fails
        state.race_next(n=1, verb="promote", i=0, flag=False)   # at watch.decided, an operator promotes v3
        state._step("monitor")
        assert auto_rollbacks(state) == [] and watch(state, 2)["state"] == "ended", watch(state, 2)

    replay(SQLITE, [], start="watching", then=run)


@EXPLICIT
@example(None)
@given(st.just(None))
def test_a_version_rolled_back_automatically_is_not_promoted_again_unforced(_):
    """Found by the model (PromotedAfterAutoRollback): a manual rollback to v2 dropped its rolled_back
    mark, so a later promote of v2 no longer asked for --force. The mark now stays."""
    def run(state):
        state.degrade(then_monitor=False, crash=None)
        state.monitor(crash=None)                          # v2 rolled back automatically to v1, and stopped
        assert watch(state, 2)["state"] == "rolled_back"
        state._step("rollback", v=2)                       # an operator brings v2 back (restarted)
        state._step("rollback", v=None)                    # and back to v1: v2 standby
        state._step("promote", v=2)                        # then promotes v2 without --force: refused
        assert watch(state, 2)["state"] == "rolled_back"

    replay(SQLITE, [], start="watching", then=run)
