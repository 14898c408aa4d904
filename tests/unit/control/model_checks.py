"""The invariants of the control plane that the model-based and stress tests check.

They read only the registry's public reads, the pointer file, the files of each version and the
job processes (found by their command line, not through kappa's own records):

- at every moment (`check_snap`): at most one version `serving`; the alias points at one
  existing version that is not retiring or retired; every state is a `VersionState`; every move
  seen is a path along the legal edges (`EDGES`; in one verb, nothing more happens to a version
  after its flip); a table or checkpoint is deleted only from a retiring or retired version, and
  never from one that serves, is standby, the rollback target, or the published version;
- after each step (`check_step`): every version whose state changed, and the alias if it moved,
  has an audit entry written during the step; and, when nothing raced it, a completed flip went
  to a version whose job runs and left it `serving`, a completed `kappa rollback` (no version
  named) moved the alias, a completed retention retired no version under fewer than `keep` newer
  versions that are not in flight;
- after a completed reconcile (`check_reconciled`): the pointer file holds the registry's alias,
  the alias's version is `serving` (or `failed`), no job runs for a version outside a running
  state, and no version has two jobs (but a version whose lease is held is its holder's);
- the watch of a promoted version (`check_watch`, issue 21): at most one watch is active at any
  moment; at most one automatic rollback (by `kappa-watch`) per promote of a version, and only of
  the version whose watch decided it; a version rolled back automatically is promoted again only
  with `--force`; after a watch pass that completed (nothing raced it), no watch is left
  `rolling_back` on the served version (unless the pass reported its rollback failed), every
  `rolled_back` watch is settled, and an active watch is on the version the alias serves.

Each invariant raises its own `Violation` subclass, so Hypothesis tells distinct ones apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.states import RUNNING, VersionState
from orchestrator.serving import read_pointer

# -- the legal moves, from orchestrator/core/states.py's docstring and issue 9 ---------------------
# created -> starting -> backfilling -> caught_up -> serving <-> standby; any running state ->
# stopped or failed (a serving job that dies keeps `serving` until supervision gives up: failed);
# a start goes through `starting` (restarts too, except of a serving or standby job, which keep
# their state); retire: stopped/failed/created -> retiring -> retired; retired is final.
EDGES: dict[str, frozenset[str]] = {
    "created": frozenset({"starting", "stopped", "failed", "retiring"}),
    "starting": frozenset({"backfilling", "caught_up", "stopped", "failed"}),
    "backfilling": frozenset({"starting", "caught_up", "stopped", "failed"}),
    "caught_up": frozenset({"starting", "serving", "stopped", "failed"}),
    "serving": frozenset({"standby", "failed"}),
    "standby": frozenset({"serving", "stopped", "failed"}),
    "stopped": frozenset({"starting", "retiring"}),
    "failed": frozenset({"starting", "retiring"}),
    "retiring": frozenset({"retired"}),
    "retired": frozenset(),
}
FLIPS = frozenset({("caught_up", "serving"), ("standby", "serving"), ("serving", "standby")})
GONE = frozenset({"retiring", "retired"})
RUNNING_STATES = frozenset(s.value for s in RUNNING)

#: Invariants (Violation class names) a local exploration run leaves unchecked, to look for others
#: past a known one: KAPPA_MODEL_IGNORE=Unaudited,IllegalMove. Empty by default (CI checks all).
IGNORED = frozenset(filter(None, os.environ.get("KAPPA_MODEL_IGNORE", "").split(",")))


def legal_move(before: str, after: str, *, flip_ends_path: bool = True) -> bool:
    """Whether one verb (or, with flip_ends_path=False, several) can move a version before -> after."""
    if before == after:
        return True
    seen, todo = {before}, [before]
    while todo:
        s = todo.pop()
        for t in EDGES.get(s, ()):
            if t == after:
                return True
            if (flip_ends_path and (s, t) in FLIPS) or t in seen:
                continue
            seen.add(t)
            todo.append(t)
    return False


class Violation(AssertionError):
    """An invariant of the control plane does not hold."""


class TwoServing(Violation): pass                       # noqa: E701
class AliasTarget(Violation): pass                      # noqa: E701
class IllegalState(Violation): pass                     # noqa: E701
class IllegalMove(Violation): pass                      # noqa: E701
class DeletedData(Violation): pass                      # noqa: E701
class Unaudited(Violation): pass                        # noqa: E701
class FlipToDeadJob(Violation): pass                    # noqa: E701
class PointerDisagrees(Violation): pass                 # noqa: E701
class ServingState(Violation): pass                     # noqa: E701
class StrayJob(Violation): pass                         # noqa: E701
class RollbackStayed(Violation): pass                   # noqa: E701
class RetentionKeep(Violation): pass                    # noqa: E701
class UnexpectedError(Violation): pass                  # noqa: E701
class TwoWatches(Violation): pass                       # noqa: E701
class TwoAutoRollbacks(Violation): pass                 # noqa: E701
class AutoRollbackUndecided(Violation): pass            # noqa: E701
class PromotedAfterAutoRollback(Violation): pass        # noqa: E701
class WatchUnfinished(Violation): pass                  # noqa: E701

#: The actor of every automatic rollback (orchestrator.lifecycle.watch.ACTOR).
WATCH_ACTOR = "kappa-watch"
#: The states of a watch that still has work to do (orchestrator.registry.store.WATCH_ACTIVE).
ACTIVE_WATCH = frozenset({"watching", "rolling_back"})


@dataclass
class Snap:
    states: dict[int, str]
    alias: tuple[int, int | None, int | None] | None   # version, previous, published
    tables: set[int]
    checkpoints: set[int]
    audit_id: int
    where: str = ""
    in_flight: frozenset[int] = frozenset()   # deployed, never served, not stopped (the registry's own word)
    watches: dict[int, tuple[str, bool]] = field(default_factory=dict)   # version: (watch state, settled)


def concerns(entry: Any, v: int) -> bool:
    """Whether an audit entry is about version v: its version, or a `*version*` detail equal to v."""
    if entry.version == v:
        return True
    return any("version" in key and isinstance(val, int) and not isinstance(val, bool) and val == v
               for key, val in (entry.details or {}).items())


def check_snap(w: Any, prev: Snap, cur: Snap, *, flip_ends_path: bool = True) -> list[Violation]:
    """The invariants that hold at every moment, and the move from `prev` to `cur`."""
    out: list[Violation] = []
    legal_states = {s.value for s in VersionState}
    for v, s in cur.states.items():
        if s not in legal_states:
            out.append(IllegalState(f"{cur.where}: v{v} is in state {s!r}, not a VersionState"))
        was = prev.states.get(v, "created")
        if was in EDGES and s in EDGES and not legal_move(was, s, flip_ends_path=flip_ends_path):
            out.append(IllegalMove(f"{cur.where}: v{v} moved {was} -> {s}, not along a legal edge"))
    serving = sorted(v for v, s in cur.states.items() if s == "serving")
    if len(serving) > 1:
        out.append(TwoServing(f"{cur.where}: {len(serving)} versions are serving: {serving}"))
    watched = sorted(v for v, (s, _) in cur.watches.items() if s in ACTIVE_WATCH)
    if len(watched) > 1:   # a flip ends the watch it leaves and starts the new one in one transaction
        out.append(TwoWatches(f"{cur.where}: {len(watched)} watches are active: {cur.watches}"))
    if cur.alias is not None:
        av = cur.alias[0]
        if av not in cur.states:
            out.append(AliasTarget(f"{cur.where}: the alias points at v{av}, which the registry does not hold"))
        elif cur.states[av] in GONE:
            out.append(AliasTarget(f"{cur.where}: the alias points at v{av}, which is {cur.states[av]}"))
    w.had_table |= cur.tables
    w.had_checkpoint |= cur.checkpoints
    protected = {v for v, s in cur.states.items() if s in ("serving", "standby")}
    if cur.alias is not None:
        protected |= {v for v in cur.alias if v is not None}
    for what, had, now in (("table", w.had_table, cur.tables), ("checkpoint", w.had_checkpoint, cur.checkpoints)):
        for v in sorted(had - now):
            state = cur.states.get(v)
            if v in protected:
                out.append(DeletedData(f"{cur.where}: the {what} of v{v} ({state}) was deleted, but it is "
                                       f"served, standby, the rollback target or published (alias {cur.alias})"))
            elif state not in GONE:
                out.append(DeletedData(f"{cur.where}: the {what} of v{v} was deleted while it is {state}, "
                                       f"not retiring or retired"))
    return out


def check_trace(w: Any, trace: list[Snap]) -> list[Violation]:
    out: list[Violation] = []
    for prev, cur in zip(trace, trace[1:]):
        out += check_snap(w, prev, cur)
    return out


def _last_flip_by(w: Any, up_to_id: int) -> str | None:
    """The verb whose flip of the alias was the last to succeed up to audit entry `up_to_id`."""
    flips = [e for e in w.k.registry.audit_log(None, limit=None, action="flip_alias")
             if e.id <= up_to_id and e.outcome == "ok" and (e.details or {}).get("alias") == w.spec.alias]
    return (flips[-1].details or {}).get("action") if flips else None


def check_step(w: Any, name: str, args: dict, out: Any, trace: list[Snap]) -> list[Violation]:
    """Every change of the step audited; a completed flip, rollback or retention did what it says."""
    found: list[Violation] = []
    before, after = trace[0], trace[-1]
    changed = {v for prev, cur in zip(trace, trace[1:]) for v, s in cur.states.items() if prev.states.get(v) != s}
    moved = before.alias is None or after.alias is None or before.alias[0] != after.alias[0]
    if changed or (moved and after.alias is not None):
        entries = [e for e in w.k.registry.audit_log(w.pipeline, limit=None) if e.id > before.audit_id]
        for v in sorted(changed | ({after.alias[0]} if moved and after.alias else set())):
            if not any(concerns(e, v) for e in entries):
                found.append(Unaudited(
                    f"{name}: v{v} went {before.states.get(v, '(new)')} -> {after.states.get(v)}"
                    f"{' (alias moved to it)' if moved and after.alias and after.alias[0] == v else ''} "
                    f"with no audit entry about it (step {out.outcome}; entries: "
                    f"{[(e.action, e.version, e.outcome) for e in entries]})"))
    if out.outcome != "ok" or out.raced:  # what a verb did is its own only when nothing raced it
        return found
    if moved and after.alias is not None:
        target = after.alias[0]
        if not w.jobs().get(target):
            found.append(FlipToDeadJob(f"{name}: flipped the alias to v{target} ({after.states.get(target)}), "
                                       f"whose job is not running"))
        if after.states.get(target) != "serving":
            found.append(ServingState(f"{name}: flipped the alias to v{target}, left {after.states.get(target)} "
                                      f"(states {after.states})"))
    # a rollback rerun after one cut off before its publish finishes that one (publishes the version
    # it flipped to, flips nothing: test_rerunning_rollback_after_the_crash_does_not_flip_back):
    # readers move all the same, from the published version to the flipped one
    finished = (before.alias is not None and after.alias is not None and before.alias[2] != before.alias[0]
                and after.alias[2] == after.alias[0] == before.alias[0]
                and _last_flip_by(w, before.audit_id) == "rollback")
    if name == "rollback" and args.get("v") is None and before.alias is not None and not moved and not finished:
        found.append(RollbackStayed(f"rollback (to the previous version) completed but the alias stayed at "
                                    f"v{after.alias[0]} (before: alias {before.alias}, states {before.states})"))
    if name == "retention":
        keep = args["v"]
        for v in sorted(u for u, s in after.states.items() if s in GONE and before.states.get(u) not in GONE):
            newer = [u for u, s in before.states.items() if u > v and s not in GONE and u not in before.in_flight]
            if len(newer) < keep:
                found.append(RetentionKeep(f"retention keep={keep} retired v{v} with only {newer} newer versions "
                                           f"that are not in flight (states before {before.states})"))
    return found


def check_reconciled(w: Any, snap: Snap) -> list[Violation]:
    """After a completed reconcile: pointer = registry, the alias's version serves, no stray job."""
    found: list[Violation] = []
    try:
        pointer = read_pointer(w.k.alias_file(w.spec.alias))
    except Exception as e:  # noqa: BLE001 - a pointer reconcile left unreadable
        pointer = f"unreadable ({type(e).__name__}: {e})"
    if snap.alias is None:
        if pointer is not None:
            found.append(PointerDisagrees(f"after reconcile: a pointer {pointer} but no alias in the registry"))
    else:
        v = snap.alias[0]
        table = str(w.k.paths(w.pipeline, v).table)
        if not isinstance(pointer, dict) or pointer.get("version") != v or pointer.get("table") != table:
            found.append(PointerDisagrees(f"after reconcile: the registry's alias is at v{v}, the pointer file "
                                          f"holds {pointer}"))
        if snap.states.get(v) not in ("serving", "failed"):
            found.append(ServingState(f"after reconcile: the alias serves v{v}, which is {snap.states.get(v)} "
                                      f"(states {snap.states})"))
    for v, pids in sorted(w.jobs().items()):
        state = snap.states.get(v)
        rec = w.k.registry.get_version(w.pipeline, v) if v in snap.states else None
        if rec is not None and rec.lease_held():
            continue   # reconcile leaves a version whose lease is fresh to its holder (a crashed verb's runs
            # out: the teardown expires them, and its reconcile checks this version too)
        if len(pids) > 1:
            found.append(StrayJob(f"after reconcile: {len(pids)} jobs run for v{v} ({state}): pids {pids}"))
        if state not in RUNNING_STATES:
            found.append(StrayJob(f"after reconcile: a job (pid {pids}) runs for v{v}, which is {state}"))
    return found


def _forced(entries: list, flip: Any) -> bool:
    """Whether the promote that made `flip` was forced: its own audit entry (after the flip) lists the
    checks it overrode; a promote cut off before that entry is known by the model's reason for it."""
    to = (flip.details or {}).get("to_version")
    for e in entries:
        if e.id > flip.id and e.action == "promote" and e.version == to and e.outcome == "ok":
            return bool((e.details or {}).get("forced"))
        if e.id > flip.id and e.action == "flip_alias" and e.outcome == "ok":
            break
    return "--force" in (flip.reason or "")


def _auto_rollbacks(entries: list) -> list[Violation]:
    """Over a pipeline's audit log (oldest first): one automatic rollback per promote at most, each of
    the version whose watch decided it; no unforced promote of a version rolled back automatically."""
    found: list[Violation] = []
    decided: set[int] = set()        # versions whose watch decided a rollback since their last promote
    rolled: dict[int, int] = {}      # version: the flip away from it that rolled it back (watch rolled_back)
    flips: dict[int, int] = {}       # version: automatic rollback flips from it since its last promote
    done: dict[int, int] = {}        # version: automatic `rollback` entries (outcome ok) since its last promote
    for e in entries:
        d = e.details or {}
        if e.action == "watch" and e.outcome == "rolling_back":
            decided.add(e.version)
        elif e.action == "rollback" and e.outcome == "ok" and e.actor == WATCH_ACTOR:
            v = d.get("from_version")
            done[v] = done.get(v, 0) + 1
            if done[v] > 1:
                found.append(TwoAutoRollbacks(f"audit #{e.id}: a second automatic rollback of v{v} (entry "
                                              f"'rollback' ok by {WATCH_ACTOR}) since its last promote"))
        elif e.action == "flip_alias" and e.outcome == "ok" and d.get("action") in ("promote", "rollback"):
            frm, to = d.get("from_version"), d.get("to_version")
            if d["action"] == "rollback" and e.actor == WATCH_ACTOR:
                if frm not in decided:
                    found.append(AutoRollbackUndecided(
                        f"audit #{e.id}: {WATCH_ACTOR} flipped the alias from v{frm} to v{to}, but no watch "
                        f"decided to roll v{frm} back (decided since their promote: {sorted(decided)})"))
                flips[frm] = flips.get(frm, 0) + 1
                if flips[frm] > 1:
                    found.append(TwoAutoRollbacks(f"audit #{e.id}: a second automatic rollback flip from "
                                                  f"v{frm} since its last promote"))
            if frm in decided:   # this flip ended a watch rolling back: now rolled_back
                rolled[frm] = e.id
                decided.discard(frm)
            if d["action"] == "promote":
                if to in rolled and not _forced(entries, e):
                    found.append(PromotedAfterAutoRollback(
                        f"audit #{e.id}: v{to} promoted again (by {e.actor}, not forced) after its automatic "
                        f"rollback (flip #{rolled[to]})"))
                rolled.pop(to, None)
                decided.discard(to)
                flips[to] = done[to] = 0
    return found


def check_watch(w: Any, name: str, out: Any, trace: list[Snap], passes: list[list[dict]]) -> list[Violation]:
    """The watch's invariants after a step (see the module); `passes`: the actions of each watch pass
    this step's verb completed."""
    found: list[Violation] = []
    before, after = trace[0], trace[-1]
    if after.audit_id > before.audit_id:
        found += _auto_rollbacks(w.k.registry.audit_log(w.pipeline, limit=None))
    if out.raced:
        return found
    served = after.alias[0] if after.alias is not None else None
    for v, (state, _) in sorted(after.watches.items()):
        if state in ACTIVE_WATCH and v != served:
            found.append(WatchUnfinished(f"{name}: the watch of v{v} is {state}, but the alias serves "
                                         f"{served and f'v{served}'} (watches {after.watches})"))
    if not passes:
        return found
    failed = {a.get("version") for p in passes for a in p if a.get("kind") == "rollback_failed"}
    for v, (state, settled) in sorted(after.watches.items()):
        if state == "rolling_back" and v == served and v not in failed:
            found.append(WatchUnfinished(f"{name}: its watch pass completed, but the watch of v{v} is left "
                                         f"rolling_back while the alias still serves it (actions {passes})"))
        if state == "rolled_back" and not settled:
            found.append(WatchUnfinished(f"{name}: its watch pass completed, but the rolled_back watch of v{v} "
                                         f"is not settled (actions {passes})"))
    return found
