"""DeltaSink on local Delta tables: upsert, deletes, idempotent app transactions, rejects, metadata."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from jobs.lib.delta_sink import REJECTS_SCHEMA, DeltaSink, count_rows, latest_per_key, read_table
from orchestrator.core.exceptions import SinkError

SCHEMA = pa.schema([("member_id", pa.string()), ("title", pa.string()), ("source_offset", pa.int64()),
                    ("_deleted", pa.bool_())])


def batch(*rows) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, (*r, False) if len(r) == 3 else r)) for r in rows],
                                schema=SCHEMA)


def current(uri) -> dict:
    return {r["member_id"]: (r["title"], r["source_offset"]) for r in read_table(uri).to_pylist()}


@pytest.fixture
def sink(tmp_path):
    return DeltaSink(tmp_path / "out", tmp_path / "out__rejects", "kappa.standardize.v3",
                     {"pipeline": "standardize", "version": 3, "rules_hash": "abc123"})


def test_upsert_append_merge_delete_and_metadata(sink):
    assert not sink.committed(0) and count_rows(sink.table_uri) == 0
    r0 = sink.upsert(0, batch(("m1", "SWE", 0), ("m2", "PM", 1), ("m3", "x", 2, True)), ["member_id"],
                     end_offsets={"t": {"0": 3}})
    assert (r0.operation, r0.skipped) == ("append", False)
    assert current(sink.table_uri) == {"m1": ("SWE", 0), "m2": ("PM", 1)}
    r1 = sink.upsert(1, batch(("m1", "Senior SWE", 3), ("m2", None, 4, True), ("m4", "CTO", 5)), ["member_id"],
                     end_offsets={"t": {"0": 6}})
    assert r1.operation == "merge"
    assert current(sink.table_uri) == {"m1": ("Senior SWE", 3), "m4": ("CTO", 5)}
    assert read_table(sink.table_uri).schema.names == ["member_id", "title", "source_offset"]
    assert sink.committed(0) and sink.committed(1) and not sink.committed(2)
    info = DeltaTable(sink.table_uri).history(1)[0]
    assert info["pipeline"] == "standardize" and info["pipeline_version"] == "3"
    assert info["version"] == 1  # history() reports the table version here
    assert info["rules_hash"] == "abc123" and info["batch_id"] == "1"
    assert json.loads(info["end_offsets"]) == {"t": {"0": 6}}
    assert DeltaTable(sink.table_uri).transaction_version("kappa.standardize.v3") == 1


def test_a_committed_batch_is_skipped_before_any_work(sink, tmp_path):
    sink.upsert(0, batch(("m1", "SWE", 0)), ["member_id"])
    version = DeltaTable(sink.table_uri).version()
    again = DeltaSink(sink.table_uri, sink.rejects_uri, sink.app_id)  # a restarted job
    assert again.committed(0)
    r = again.upsert(0, batch(("m1", "CHANGED", 0), ("m9", "new", 1)), ["member_id"])
    assert (r.skipped, r.operation) == (True, "skip")
    assert again.append(0, batch(("m7", "x", 0)).drop_columns(["_deleted"])).skipped
    assert DeltaTable(sink.table_uri).version() == version
    assert current(sink.table_uri) == {"m1": ("SWE", 0)}
    other = DeltaSink(sink.table_uri, None, "kappa.standardize.v4")  # another app id is not fooled
    assert not other.committed(0)


def test_latest_offset_per_key_within_the_batch(sink):
    sink.upsert(0, batch(("m1", "a", 0)), ["member_id"])
    sink.upsert(1, batch(("m1", "c", 7), ("m2", "z", 5), ("m1", "b", 4), ("m2", None, 6, True)), ["member_id"],
                order_column="source_offset")
    assert current(sink.table_uri) == {"m1": ("c", 7)}
    t = latest_per_key(batch(("a", "1", 3), ("b", "2", 1), ("a", "3", 9), ("a", "4", 2)), ["member_id"],
                       "source_offset")
    assert t.to_pylist() == [{"member_id": "b", "title": "2", "source_offset": 1, "_deleted": False},
                             {"member_id": "a", "title": "3", "source_offset": 9, "_deleted": False}]


def test_first_batch_with_only_deletes_creates_the_table(sink):
    sink.upsert(0, batch(("m1", None, 0, True)), ["member_id"], end_offsets={"t": {"0": 1}})
    assert count_rows(sink.table_uri) == 0 and sink.committed(0)
    sink.upsert(1, batch(("m1", "back", 1)), ["member_id"])
    assert current(sink.table_uri) == {"m1": ("back", 1)}


def test_rejects_are_written_once(sink):
    rejects = pa.table({"key": [b"k", None], "value": [b"{", b"x"], "topic": ["t", "t"], "partition": [0, 1],
                        "offset": [5, 9], "error": ["invalid JSON", "no key"], "batch_id": [2, 2]})
    assert sink.write_rejects(0, REJECTS_SCHEMA.empty_table()).operation == "none"
    assert count_rows(sink.rejects_uri) == 0  # created, empty
    assert sink.write_rejects(2, rejects).rows == 2
    restarted = DeltaSink(sink.table_uri, sink.rejects_uri, sink.app_id)
    assert restarted.write_rejects(2, rejects).skipped
    got = read_table(sink.rejects_uri)
    assert got.schema.equals(REJECTS_SCHEMA)
    assert sorted(got.to_pylist(), key=lambda r: r["offset"]) == [
        {"key": b"k", "value": b"{", "topic": "t", "partition": 0, "offset": 5, "error": "invalid JSON", "batch_id": 2},
        {"key": None, "value": b"x", "topic": "t", "partition": 1, "offset": 9, "error": "no key", "batch_id": 2}]


def test_errors(sink, tmp_path):
    with pytest.raises(SinkError, match="no Delta table at .*nothing"):
        read_table(tmp_path / "nothing")
    with pytest.raises(SinkError, match="column '_deleted' missing"):
        sink.upsert(0, batch(("m1", "a", 0)).drop_columns(["_deleted"]), ["member_id"])
    sink.upsert(0, batch(("m1", "a", 0)), ["member_id"])
    drifted = pa.table({"member_id": ["m2"], "title": ["a"], "oops": [1], "_deleted": [False]})
    with pytest.raises(SinkError) as e:
        sink.upsert(1, drifted, ["member_id"])
    assert str(e.value) == (f"micro-batch 1 does not fit {sink.table_uri}: columns missing ['source_offset'], "
                            f"extra ['oops']; the job's output schema changed, so write a new version to a new table")
    wrong = pa.table({"member_id": ["m2"], "title": [[1, 2]], "source_offset": [1], "_deleted": [False]})
    with pytest.raises(SinkError, match="upsert of micro-batch 1 into .* failed: "):
        sink.upsert(1, wrong, ["member_id"])
    assert not sink.committed(1) and current(sink.table_uri) == {"m1": ("a", 0)}
