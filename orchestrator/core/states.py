"""The states of a version, and the sets of them that the verbs reason about.

A version moves created -> starting -> backfilling -> caught_up -> serving <-> standby, and from
any running state to stopped or failed; retired is final. `VersionState` is a `StrEnum`, so its
members compare equal to the strings stored in the registry and written to JSON.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["VersionState", "ALL", "IN_FLIGHT", "RUNNING", "LIVE", "RunState", "ENDED_RUNS"]


class VersionState(StrEnum):
    CREATED = "created"
    STARTING = "starting"
    BACKFILLING = "backfilling"
    CAUGHT_UP = "caught_up"
    SERVING = "serving"
    STANDBY = "standby"
    STOPPED = "stopped"
    FAILED = "failed"
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
