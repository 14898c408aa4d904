"""The per-key state functions of the two keyed-state jobs, driven without Spark.

Spark calls them once per key and micro-batch with the key's rows and its GroupState; `FakeState`
has the same surface (exists, get, update, remove).
"""

from __future__ import annotations

import json

import pandas as pd

from jobs.pageview_enrich import enrich_member
from jobs.profile_settings_join import join_member

P, S, V = "profiles", "settings", "views"


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


def test_join_emits_latest_joined_record_and_outer_settings():
    state = FakeState()
    data, rejects = run(join_member, (P, S), [
        (S, 0, 5, 1, {"language": "en", "email_notifications": True, "visibility": "public"}),
        (P, 0, 7, 2, {"name": "Ana", "zip": "10115"}),
        (P, 0, 9, 3, {"name": "Ana B", "zip": "10117"}),
        (S, 0, 6, 4, "not json".encode()),
    ], state)
    assert rejects == [{"topic": S, "partition": 0, "offset": 6, "error": rejects[0]["error"]}]
    assert rejects[0]["error"].startswith("value is not JSON")
    assert data == [{"member_id": "m1", "name": "Ana B", "title": None, "company": None, "location": None,
                     "zip": "10117", "language": "en", "email_notifications": True, "visibility": "public",
                     "profile_offset": 9, "settings_offset": 5, "_deleted": False}]
    # settings deleted: the profile stays, settings columns null
    data, _ = run(join_member, (P, S), [(S, 0, 8, 5, None)], state)
    assert data[0]["language"] is None and data[0]["settings_offset"] is None and data[0]["name"] == "Ana B"
    # profile deleted: the row is deleted and the state forgets the member
    data, _ = run(join_member, (P, S), [(P, 0, 11, 6, None)], state)
    assert data[0]["_deleted"] is True and data[0]["name"] is None
    assert state.value is None


def test_join_keeps_settings_until_the_profile_arrives():
    state = FakeState()
    data, _ = run(join_member, (P, S), [(S, 1, 0, 1, {"language": "fr"})], state)
    assert data == [dict(data[0], _deleted=True)]
    data, _ = run(join_member, (P, S), [(P, 1, 3, 2, {"name": "Zoë"})], state)
    assert data[0]["_deleted"] is False and data[0]["language"] == "fr" and data[0]["name"] == "Zoë"


def test_join_batch_of_only_rejects_emits_no_row():
    state = FakeState(('{"name": "A"}', 1, None, None))
    data, rejects = run(join_member, (P, S), [(P, 0, 2, 1, {"title": "no name"})], state)
    assert data == [] and [r["error"] for r in rejects] == ["field 'name' is missing"]
    assert state.value == ('{"name": "A"}', 1, None, None)


def test_join_rejects_every_record_of_a_bad_key():
    data, rejects = run(join_member, (P, S), [(P, 0, 1, 1, {"name": "A"}), (S, 0, 2, 2, {})],
                        FakeState(), key=None)
    assert data == []
    assert [r["error"] for r in rejects] == ["null key: member profile records are keyed by member_id",
                                             "null key: member settings records are keyed by member_id"]


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
