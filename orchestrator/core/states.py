"""The states of a version, and the sets of them that the verbs reason about.

A version moves created -> starting -> backfilling -> caught_up -> serving <-> standby, and from
any running state to stopped or failed; retire moves a version that serves nothing to retiring
(before anything is deleted) and then to retired, which is final. `TRANSITIONS` lists every legal
move; the product's verbs make each one as a compare-and-swap from the state they read. `VersionState` is a `StrEnum`, so its
members compare equal to the strings stored in the registry and written to JSON.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["VersionState", "ALL", "IN_FLIGHT", "RUNNING", "LIVE", "FLIP_TARGETS", "FORCED_FLIP_TARGETS", "TRANSITIONS",
           "legal",
           "RunState", "ENDED_RUNS"]


class VersionState(StrEnum):
    CREATED = "created"
    STARTING = "starting"
    BACKFILLING = "backfilling"
    CAUGHT_UP = "caught_up"
    SERVING = "serving"
    STANDBY = "standby"
    STOPPED = "stopped"
    FAILED = "failed"
    RETIRING = "retiring"
    RETIRED = "retired"


S = VersionState

#: Every state, in lifecycle order.
ALL: tuple[VersionState, ...] = tuple(VersionState)
#: Deployed and not yet promotable or promoted: a second deploy of the pipeline must wait for these.
IN_FLIGHT: frozenset[VersionState] = frozenset({S.CREATED, S.STARTING, S.BACKFILLING, S.CAUGHT_UP})
#: States in which the version's job is expected to be running.
RUNNING: frozenset[VersionState] = frozenset({S.STARTING, S.BACKFILLING, S.CAUGHT_UP, S.SERVING, S.STANDBY})
#: What `kappa status` shows by default: running versions (the same set, named for the reader).
LIVE: frozenset[VersionState] = RUNNING
#: States an alias may be flipped to: a caught-up version (promote), a standby (rollback), or the
#: one already serving (a no-op). Checked in the flip's own transaction.
FLIP_TARGETS: frozenset[VersionState] = frozenset({S.CAUGHT_UP, S.STANDBY, S.SERVING})
#: ... and, for a rollback forced at its deadline (`kappa rollback --force`, audited), a restarted
#: version whose running job has not caught up yet.
FORCED_FLIP_TARGETS: frozenset[VersionState] = FLIP_TARGETS | {S.STARTING, S.BACKFILLING}

_RESTARTABLE = frozenset({S.STARTING, S.STOPPED, S.FAILED})
#: Every legal move of a version state (a restart of a serving or standby job keeps its state;
#: any other start goes through `starting`).
TRANSITIONS: dict[VersionState, frozenset[VersionState]] = {
    S.CREATED: frozenset({S.STARTING, S.STOPPED, S.FAILED, S.RETIRING}),
    S.STARTING: frozenset({S.STARTING, S.BACKFILLING, S.CAUGHT_UP, S.SERVING, S.STOPPED, S.FAILED}),
    S.BACKFILLING: frozenset({S.STARTING, S.CAUGHT_UP, S.SERVING, S.STOPPED, S.FAILED}),
    S.CAUGHT_UP: frozenset({S.STARTING, S.SERVING, S.STOPPED, S.FAILED}),
    S.SERVING: frozenset({S.STANDBY, S.FAILED}),
    S.STANDBY: frozenset({S.SERVING, S.STOPPED, S.FAILED}),
    S.STOPPED: _RESTARTABLE | {S.RETIRING},
    S.FAILED: _RESTARTABLE | {S.RETIRING},
    S.RETIRING: frozenset({S.RETIRED}),
    S.RETIRED: frozenset(),
}


def legal(before: str, after: str) -> bool:
    """Whether a version may move from `before` to `after` (staying put is always legal)."""
    return before == after or VersionState(after) in TRANSITIONS[VersionState(before)]


class RunState(StrEnum):
    """A job process's own `state` in its status.json, not a version state.

    ``starting -> running``, then ``stopping`` on a stop request, and one of the final states
    ``stopped``, ``finished`` (available-now reached its end) or ``failed``. The job writes it;
    job control reads it (jobs import this module without pulling in Spark on the other side).
    """

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FINISHED = "finished"
    FAILED = "failed"


#: Run states in which the job has ended without failing.
ENDED_RUNS: frozenset[RunState] = frozenset({RunState.STOPPED, RunState.FINISHED})
