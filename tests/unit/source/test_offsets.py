"""Offset arithmetic and a query's offsets read back from its Spark checkpoint (no services)."""

from __future__ import annotations

import json

import pytest

from jobs.lib.source.checkpoint import checkpoint_offsets, last_committed_batch
from jobs.lib.source.offsets import map_to_offsets, offsets_to_map
from orchestrator.core.exceptions import SourceError


# --- offsets JSON ------------------------------------------------------------------------------

def test_offsets_round_trip_in_canonical_order():
    m = offsets_to_map({"b": {"10": 5, "2": 7}, "a": {"0": 1}})
    assert m == {("b", 10): 5, ("b", 2): 7, ("a", 0): 1}
    out = map_to_offsets(m)
    assert list(out) == ["a", "b"]
    assert list(out["b"]) == ["2", "10"]  # numeric, not lexical
    assert json.dumps(out) == '{"a": {"0": 1}, "b": {"2": 7, "10": 5}}'


@pytest.mark.parametrize("bad, fragment", [
    ([1, 2], "must be a JSON object"),
    ({"t": 5}, "offsets of topic 't' must be an object"),
    ({"t": {"0": "x"}}, "offset of topic 't' partition '0' must be an integer"),
])
def test_offsets_shape_errors_name_the_problem(bad, fragment):
    with pytest.raises(SourceError, match=fragment):
        offsets_to_map(bad)


# --- checkpoint --------------------------------------------------------------------------------

def _write_batch(cp, batch_id, *sources, committed=True):
    (cp / "offsets").mkdir(parents=True, exist_ok=True)
    (cp / "commits").mkdir(parents=True, exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})]
    lines += [json.dumps(s) if s is not None else "-" for s in sources]
    (cp / "offsets" / str(batch_id)).write_text("\n".join(lines))
    if committed:
        (cp / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_checkpoint_offsets_of_last_committed_batch(tmp_path):
    assert checkpoint_offsets(tmp_path) is None
    _write_batch(tmp_path, 0, {"t": {"0": 10, "1": 5}})
    _write_batch(tmp_path, 1, {"t": {"0": 20, "1": 9}})
    _write_batch(tmp_path, 2, {"t": {"0": 30, "1": 9}}, committed=False)
    assert checkpoint_offsets(tmp_path) == {"t": {"0": 20, "1": 9}}
    assert last_committed_batch(tmp_path) == 1
    assert checkpoint_offsets(tmp_path, batch_id=2) == {"t": {"0": 30, "1": 9}}
    assert checkpoint_offsets(tmp_path, batch_id=0) == {"t": {"0": 10, "1": 5}}
    assert checkpoint_offsets(tmp_path, batch_id=7) is None


def test_checkpoint_offsets_merges_sources_and_ignores_others(tmp_path):
    _write_batch(tmp_path, 0, {"a": {"0": 10}}, None, {"logOffset": 3}, {"b": {"0": 4}, "a": {"0": 8}})
    assert checkpoint_offsets(tmp_path) == {"a": {"0": 8}, "b": {"0": 4}}
