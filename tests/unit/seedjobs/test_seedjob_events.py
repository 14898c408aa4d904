"""Parsing of the seed jobs' JSON events: typed rows, or the exact reason a record is rejected."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from orchestrator.dev import seedgen

from jobs.lib.source.events import (
    AD_CLICK, AD_IMPRESSION, PAGE_VIEW, PROFILE, SETTINGS,
    parse_record, parse_timestamp, parsed_schema,
)
from jobs.lib.runtime.seedjob import rejects_and_counts

UTC = timezone.utc


def view(**over) -> bytes:
    doc = {"view_id": "pv-1", "member_id": "m1", "page": "/jobs", "viewed_at": "2024-05-01T10:15:00Z"}
    doc.update(over)
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode()


def test_page_view_parses_to_typed_row():
    row, error = parse_record(PAGE_VIEW, b"m1", view(page="/in/李雷"))
    assert error is None
    assert row == {"view_id": "pv-1", "member_id": "m1", "page": "/in/李雷",
                   "viewed_at": datetime(2024, 5, 1, 10, 15, tzinfo=UTC)}


@pytest.mark.parametrize("key,value,reason", [
    (None, view(), "null key: page view records are keyed by member_id"),
    (b"", view(), "empty key: page view records are keyed by member_id"),
    (b"\xff\xfe", view(), "key is not UTF-8 (invalid start byte at byte 0)"),
    (b"m1", None, "null value: page view events have no tombstones"),
    (b"m1", b'{"member_id": "m1", ', "value is not JSON: "),
    (b"m1", b"[1, 2]", "value is not a JSON object but list"),
    (b"m1", view().decode().encode("utf-16"), "value is not UTF-8 (invalid start byte at byte 0)"),
    (b"m1", view().replace(b'"/jobs"', b'"\\ud800"'),
     "field 'page' holds invalid unicode (a lone surrogate): '\\ud800'"),
    (b"m1", view(page=...), "field 'page' is missing"),
    (b"m1", view(page=42), "field 'page' must be a string, got int 42"),
    (b"m1", view(viewed_at="2024-05-01T10:15:00"),
     "field 'viewed_at' is not an ISO-8601 timestamp with a UTC offset: '2024-05-01T10:15:00'"),
    (b"m1", view(viewed_at="yesterday"), "field 'viewed_at' is not an ISO-8601 timestamp"),
    (b"m2", view(), "field 'member_id' is 'm1' but the record key is 'm2'"),
])
def test_page_view_rejects_name_the_reason(key, value, reason):
    row, error = parse_record(PAGE_VIEW, key, value)
    assert row is None
    assert error.startswith(reason)


def test_profile_needs_a_name_and_takes_optional_fields():
    row, error = parse_record(PROFILE, b"m1", b'{"name": "Zo\xc3\xab", "zip": "02134", "updated_at": "x"}')
    assert error is None
    assert row == {"name": "Zoë", "title": None, "company": None, "location": None, "zip": "02134"}
    assert parse_record(PROFILE, b"m1", b'{"title": "SWE"}') == (None, "field 'name' is missing")
    assert parse_record(PROFILE, b"m1", b'{"name": "A", "zip": 2134}') == (
        None, "field 'zip' must be a string, got int 2134")
    assert parse_record(PROFILE, b"m1", b'{"name": "A", "member_id": "m9"}') == (
        None, "field 'member_id' is 'm9' but the record key is 'm1'")


def test_settings_types_and_choices():
    row, error = parse_record(SETTINGS, b"m1", b'{"language": "de", "email_notifications": false}')
    assert error is None
    assert row == {"language": "de", "email_notifications": False, "visibility": None}
    assert parse_record(SETTINGS, b"m1", b'{"email_notifications": "yes"}') == (
        None, "field 'email_notifications' must be true or false, got 'yes'")
    assert parse_record(SETTINGS, b"m1", b'{"visibility": "everyone"}') == (
        None, "field 'visibility' is 'everyone', expected one of public, connections, private")


def test_ad_events_are_keyed_by_impression_id():
    imp = b'{"impression_id": "i1", "ad_id": "a", "member_id": "m1", "shown_at": "2024-05-01T10:00:00+02:00"}'
    row, error = parse_record(AD_IMPRESSION, b"i1", imp)
    assert error is None and row["shown_at"] == datetime(2024, 5, 1, 8, 0, tzinfo=UTC)
    click = json.dumps({"click_id": "c1", "impression_id": "i1", "member_id": "m1",
                        "clicked_at": "2024-05-01T08:01:00Z"}).encode()
    assert parse_record(AD_CLICK, b"i2", click) == (
        None, "field 'impression_id' is 'i1' but the record key is 'i2'")


def test_timestamp_round_trip_with_the_seed_generator():
    ts = datetime(2024, 5, 1, 10, 15, 0, 123000, tzinfo=UTC)
    assert seedgen.iso(ts) == "2024-05-01T10:15:00.123Z"
    assert parse_timestamp(seedgen.iso(ts)) == ts
    assert parse_timestamp("2024-05-01") is None


def test_rejects_and_counts_keep_every_reject_and_count_the_records_read():
    n = 4
    parsed = pa.table({**{f.name: pa.nulls(n, f.type) for f in parsed_schema(PAGE_VIEW)}})
    parsed = parsed.set_column(parsed.schema.get_field_index("offset"), "offset", pa.array(range(10, 14), pa.int64()))
    parsed = parsed.set_column(parsed.schema.get_field_index("error"), "error",
                               pa.array([None, "value is not JSON", "null key", None]))
    parsed = parsed.set_column(parsed.schema.get_field_index("value"), "value",
                               pa.array([None, b"garbage", b"{}", None], pa.binary()))
    side = pa.Table.from_batches(list(rejects_and_counts(parsed.to_batches())))
    assert side.column_names == ["key", "value", "topic", "partition", "offset", "error", "input_rows"]
    rejects = side.filter(side.column("error").is_valid())
    assert rejects.column("offset").to_pylist() == [11, 12]
    assert rejects.column("value").to_pylist() == [b"garbage", b"{}"]
    assert side.column("input_rows").drop_null().to_pylist() == [4]
