"""Offset arithmetic: Spark's offset JSON and kappa's ``{(topic, partition): offset}`` maps.

Spark's offset JSON is a plain dict ``{"topic": {"0": 120, "1": 98}}`` giving the NEXT offset to
read per partition (what its Kafka source logs in ``<checkpoint>/offsets/<batch id>``); the code
that computes with offsets uses ``{(topic, partition): offset}`` maps (`offsets_to_map`,
`map_to_offsets`). Pure functions of plain values.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from orchestrator.core.exceptions import SourceError

__all__ = ["TP", "offsets_to_map", "map_to_offsets", "merge_offsets"]

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
