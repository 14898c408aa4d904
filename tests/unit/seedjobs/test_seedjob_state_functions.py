"""The per-key state function of pageview_enrich, driven without Spark.

Spark calls them once per key and micro-batch with the key's rows and its GroupState; `FakeState`
has the same surface (exists, get, update, remove).
"""

from __future__ import annotations

import json

import pandas as pd

from jobs.pageview_enrich import enrich_member

P, V = "profiles", "views"


class FakeState:
    def __init__(self, value=None):
        self.value = value

    @property
    def exists(self):
        return self.value is not None

    @property
    def get(self):
        return self.value

    def update(self, value):
        self.value = tuple(value)

    def remove(self):
        self.value = None


def rows(*recs) -> list[pd.DataFrame]:
    """recs: (topic, partition, offset, timestamp_ms, value-or-None); Spark may split a group in chunks."""
    def raw(v):
        return v if v is None or isinstance(v, bytes) else json.dumps(v).encode()

    df = pd.DataFrame.from_records(
        [{"key": b"m1", "value": raw(v), "topic": t, "partition": p, "offset": o,
          "timestamp": pd.Timestamp(ts, unit="ms")} for t, p, o, ts, v in recs])
    return [df.iloc[:1], df.iloc[1:]] if len(df) > 1 else [df]


def run(fn, topics, recs, state, key=b"m1"):
    out = pd.concat(list(fn(*topics, (key,), iter(rows(*recs)), state)), ignore_index=True)
    assert out["input_rows"].dropna().tolist() == [len(recs)]  # every record read is counted once
    data = out[out["error"].isna() & out["input_rows"].isna()].drop(
        columns=["key", "value", "topic", "partition", "offset", "error", "input_rows"])
    rejects = out[out["error"].notna()][["topic", "partition", "offset", "error"]]
    return data.to_dict("records"), rejects.to_dict("records")


def view(i, at="2024-05-01T10:00:00Z"):
    return {"view_id": f"pv-{i}", "member_id": "m1", "page": "/feed", "viewed_at": at}


def test_enrich_uses_the_zip_current_at_each_views_position():
    state = FakeState()
    data, rejects = run(enrich_member, (V, P), [
        (V, 0, 0, 1000, view(0)),                          # before any profile: null
        (P, 1, 0, 2000, {"name": "A", "zip": "10115"}),
        (V, 0, 1, 2000, view(1)),                          # same millisecond: profile first
        (P, 1, 1, 3000, {"name": "A"}),                    # profile without a zip
        (V, 0, 2, 4000, view(2)),
        (P, 1, 2, 5000, {"name": "A", "zip": 99}),         # malformed: zip unchanged (null)
        (P, 1, 3, 6000, {"name": "A", "zip": "20095"}),
        (V, 0, 3, 7000, {"member_id": "m1"}),              # malformed view
        (V, 0, 4, 8000, view(4)),
    ], state)
    assert [(d["view_id"], d["zip"], d["source_offset"]) for d in data] == [
        ("pv-0", None, 0), ("pv-1", "10115", 1), ("pv-2", None, 2), ("pv-4", "20095", 4)]
    assert [(r["topic"], r["offset"]) for r in rejects] == [(P, 2), (V, 3)]
    assert state.value == ("20095",)
    data, _ = run(enrich_member, (V, P), [(P, 1, 4, 9000, None), (V, 0, 5, 9001, view(5))], state)
    assert data[0]["zip"] is None and state.value is None


def test_enrich_orders_records_without_a_timestamp_first():
    data, _ = run(enrich_member, (V, P), [(P, 0, 0, None, {"name": "A", "zip": "11111"}),
                                         (V, 0, 0, 1000, view(0))], FakeState())
    assert data[0]["zip"] == "11111"


def test_enrich_keeps_each_topics_offset_order_when_timestamps_go_back():
    # The producer's clock went back between the two profile records: the later offset still wins.
    data, _ = run(enrich_member, (V, P), [
        (P, 0, 0, 5000, {"name": "A", "zip": "11111"}),
        (P, 0, 1, 4000, {"name": "A", "zip": "22222"}),
        (V, 0, 0, 6000, view(0)),
    ], FakeState())
    assert data[0]["zip"] == "22222"
