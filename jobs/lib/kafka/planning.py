"""Micro-batch planning of the Kafka source: offset JSON, row caps, end offsets, task ranges.

Pure functions of plain values, unit-tested without a broker. They run on the driver, and must
stay deterministic: Spark calls `plan_ranges` again with the logged offsets after a restart and
must get the same tasks. Offsets are Spark's offset JSON, a plain dict
``{"topic": {"0": 120, "1": 98}}`` giving the NEXT offset to read per partition; inside the source
they are ``{(topic, partition): offset}`` maps (`offsets_to_map`, `map_to_offsets`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from orchestrator.core.exceptions import SourceError

__all__ = [
    "TP", "offsets_to_map", "map_to_offsets", "merge_offsets", "split_cap", "Watermarks", "Plan", "plan_end_offsets",
    "RangeSpec", "plan_ranges",
]

#: (topic, partition)
TP = tuple[str, int]


def offsets_to_map(offsets: Mapping[str, Mapping[str, int]] | None) -> dict[TP, int]:
    """``{"t": {"0": 5}}`` -> ``{("t", 0): 5}``; validates the shape so a bad option fails clearly."""
    out: dict[TP, int] = {}
    if not offsets:
        return out
    if not isinstance(offsets, Mapping):
        raise SourceError(f"offsets must be a JSON object {{\"topic\": {{\"0\": 5}}}}, got {offsets!r}")
    for topic, parts in offsets.items():
        if not isinstance(parts, Mapping):
            raise SourceError(
                f"offsets of topic {topic!r} must be an object of partition -> offset, got {parts!r}")
        for p, o in parts.items():
            try:
                out[(str(topic), int(p))] = int(o)
            except (TypeError, ValueError):
                raise SourceError(
                    f"offset of topic {topic!r} partition {p!r} must be an integer, got {o!r}") from None
    return out


def map_to_offsets(m: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """Inverse of `offsets_to_map`, in canonical order (topics sorted, partitions numerically).

    Canonical order matters: Spark decides that a source has no new data when the JSON it returns
    equals the start JSON.
    """
    out: dict[str, dict[str, int]] = {}
    for (t, p) in sorted(m):
        out.setdefault(t, {})[str(p)] = int(m[(t, p)])
    return out


def merge_offsets(maps: Iterable[Mapping[TP, int]]) -> dict[TP, int]:
    """The offsets of several sources of one query as one map: where two sources read the same
    partition the lower offset wins, so the result never overstates progress."""
    merged: dict[TP, int] = {}
    for m in maps:
        for tp, o in m.items():
            merged[tp] = min(o, merged.get(tp, o))
    return merged


def split_cap(available: Mapping[TP, int], cap: int) -> dict[TP, int]:
    """Share a row cap across partitions: equal shares, what one cannot use goes to the others.

    Deterministic. The sum is ``min(cap, sum(available))``; a remainder smaller than the number of
    partitions goes one each to the partitions with the most left (ties: topic, partition order).
    """
    alloc = {tp: 0 for tp in available}
    remaining = max(0, int(cap))
    active = sorted(tp for tp, n in available.items() if n > 0)
    while remaining > 0 and active:
        share = remaining // len(active)
        if share == 0:
            by_most_left = sorted(active, key=lambda tp: (-(available[tp] - alloc[tp]), tp))
            for tp in by_most_left[:remaining]:
                alloc[tp] += 1
            break
        for tp in active:
            give = min(share, available[tp] - alloc[tp])
            alloc[tp] += give
            remaining -= give
        active = [tp for tp in active if alloc[tp] < available[tp]]
    return alloc


@dataclass(frozen=True)
class Watermarks:
    """Log start and end of one partition; ``high`` is the last stable offset under read_committed."""

    low: int
    high: int


@dataclass
class Plan:
    """What `plan_end_offsets` decided: end offsets, and the offsets it chose to skip."""

    end: dict[TP, int]
    skipped: dict[TP, tuple[int, int]] = field(default_factory=dict)  # tp -> (from, to)
    new_partitions: list[TP] = field(default_factory=list)


def plan_end_offsets(start: Mapping[TP, int], watermarks: Mapping[TP, Watermarks], *,
                     max_rows: int | None, target: Mapping[TP, int] | None = None,
                     on_missing: str = "fail") -> Plan:
    """End offsets of the next micro-batch. Runs on the driver; pure.

    * Every partition of ``start`` stays in the result (a vanished topic keeps its offsets).
    * Partitions not in ``start`` are new: they start at 0 (or their log start if it moved).
    * ``target`` (available-now) caps every partition; partitions absent from it get no data.
    * ``max_rows`` caps the sum of offset deltas (an upper bound of records: gaps only shrink it).
    * A start below the log start or beyond the log end is data the broker no longer has:
      ``SourceError`` under ``on_missing="fail"``; under ``"earliest"`` the batch continues from the
      log start and the skipped offsets are reported in ``Plan.skipped``.
    """
    missing: list[str] = []
    eff_start: dict[TP, int] = {}
    limit_to: dict[TP, int] = {}
    plan = Plan(end={})
    for tp in sorted(set(start) | set(watermarks)):
        wm = watermarks.get(tp)
        is_new = tp not in start
        s = start.get(tp, 0)
        if wm is None:
            plan.end[tp] = s
            continue
        if is_new:
            plan.new_partitions.append(tp)
        if s < wm.low or s > wm.high:
            if not is_new and on_missing != "earliest":
                if s < wm.low:
                    missing.append(f"{tp[0]}[{tp[1]}] next offset {s} < log start {wm.low} "
                                   f"({wm.low - s} offsets deleted by retention or compaction)")
                else:
                    missing.append(f"{tp[0]}[{tp[1]}] next offset {s} > log end {wm.high} "
                                   f"(the topic was recreated or the log truncated)")
                continue
            if not is_new:
                plan.skipped[tp] = (s, wm.low)
            s = wm.low
        eff_start[tp] = s
        high = wm.high
        if target is not None:
            high = min(high, target.get(tp, s))
        limit_to[tp] = max(s, high)
    if missing:
        raise SourceError(
            "the broker no longer has offsets this query must read: " + "; ".join(missing)
            + ". Reprocess from a new checkpoint, or set the source option failOnDataLoss=false "
              "(on.missing.offsets=earliest) "
              "to continue from the earliest available offsets (skipped offsets are logged)."
        )
    available = {tp: limit_to[tp] - eff_start[tp] for tp in eff_start}
    alloc = available if max_rows is None else split_cap(available, max_rows)
    for tp, s in eff_start.items():
        plan.end[tp] = s + alloc[tp]
    return plan


@dataclass(frozen=True)
class RangeSpec:
    topic: str
    partition: int
    start: int
    end: int
    new: bool = False


def plan_ranges(start: Mapping[TP, int], end: Mapping[TP, int], *, min_partitions: int = 2,
                split_min_records: int = 10_000) -> list[RangeSpec]:
    """Per-partition offset ranges of one micro-batch, large ones split so every core has work.

    Deterministic in (start, end): Spark calls it again with the logged offsets after a restart.
    A partition missing from ``start`` is new and reads from 0. ``end < start`` only comes from a
    rewind under ``failOnDataLoss=false`` (log end moved below the checkpoint): the range is
    then read from 0 too. Such a range's log start is not in the logged offsets (it may be above 0,
    and may move between a run and its replay), so EVERY piece of it is marked ``new``: the reader
    moves a new piece up to the log start, and finishes a piece that lies wholly below it empty.
    Marking only the first piece made the others fail offset-out-of-range on every restart.
    """
    whole: list[RangeSpec] = []
    for tp in sorted(end):
        e = end[tp]
        new = tp not in start
        s = start.get(tp, 0)
        if e < s:
            s, new = 0, True
        if e > s:
            whole.append(RangeSpec(tp[0], tp[1], s, e, new))
    total = sum(r.end - r.start for r in whole)
    if not total:
        return []
    piece = max(int(split_min_records), math.ceil(total / max(1, int(min_partitions))), 1)
    out: list[RangeSpec] = []
    for r in whole:
        n = math.ceil((r.end - r.start) / piece)
        size = math.ceil((r.end - r.start) / n)
        for a in range(r.start, r.end, size):
            out.append(RangeSpec(r.topic, r.partition, a, min(a + size, r.end), r.new))
    return out
