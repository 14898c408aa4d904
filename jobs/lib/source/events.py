"""JSON event schemas of the seed jobs and their parsing; the plumbing the seed jobs share.

Every record of the seed topics is a Kafka record whose value is a UTF-8 JSON object:

=================  =====================  ==================================================
topic (role)       key                    value fields
=================  =====================  ==================================================
page views         member id              view_id, member_id, page, viewed_at
member profiles    member id              name; title, company, location, zip (optional)
member settings    member id              language, email_notifications, visibility (opt.)
ad impressions     impression id          impression_id, ad_id, member_id, shown_at
ad clicks          impression id          click_id, impression_id, member_id, clicked_at
=================  =====================  ==================================================

Timestamps are ISO-8601 strings with a UTC offset (``2024-05-01T10:15:00Z``); a timestamp
without an offset is rejected rather than guessed. A field naming the record's identity
(``member_id`` of a page view, ``impression_id`` of an ad event) must equal the record key:
the keyed-state jobs group by the key, so a value that disagrees with it would join the wrong state.
A profile needs a name, as the standardize job over the same topic requires, so that every job
reading `member_profiles` agrees on which records are valid. Unknown fields are ignored.
Profiles and settings are changelogs: a null value (tombstone) deletes the member, and the
caller handles it before parsing. Events have no tombstones; a null value is rejected.

Parsing never raises: it returns the typed row or the reason the record was rejected, and
the jobs write that reason to the version's rejects table. `parse_record` is the exact parser:
the stateless jobs parse in the JVM (`jobs.lib.source.event_columns.parse_events`, which sends it only
the records the JVM cannot vouch for), the stateful pandas functions call it on executors.

What the seed jobs share around Spark (the rejects and counts beside the output, the
micro-batch writer) is `jobs.lib.runtime.seedjob`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

__all__ = [
    "STRING", "TIMESTAMP", "BOOL", "EventType", "PAGE_VIEW", "PROFILE", "SETTINGS", "AD_IMPRESSION", "AD_CLICK",
    "parse_timestamp", "decode_key", "parse_value", "parse_record", "POSITION_FIELDS", "RAW_FIELDS",
    "parsed_schema", "parsed_ddl",
]

STRING, TIMESTAMP, BOOL = "string", "timestamp", "bool"

_ARROW_TYPES = {STRING: pa.string(), TIMESTAMP: pa.timestamp("us", tz="UTC"), BOOL: pa.bool_()}
_SPARK_TYPES = {STRING: "string", TIMESTAMP: "timestamp", BOOL: "boolean"}


@dataclass(frozen=True)
class EventType:
    """The JSON schema of one topic's values.

    `fields` maps a field name to (type, required). `key_field` names the value field that must
    equal the record key (None: the key alone is the identity, and a value field of that name,
    when present, must match it too). `choices` restricts string fields to a set of values.
    """

    name: str
    key_name: str
    fields: dict[str, tuple[str, bool]]
    key_field: str | None = None
    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(n, _ARROW_TYPES[t]) for n, (t, _) in self.fields.items()])

    def spark_ddl(self) -> str:
        return ", ".join(f"{n} {_SPARK_TYPES[t]}" for n, (t, _) in self.fields.items())


PAGE_VIEW = EventType(
    name="page view", key_name="member_id", key_field="member_id",
    fields={"view_id": (STRING, True), "member_id": (STRING, True), "page": (STRING, True),
            "viewed_at": (TIMESTAMP, True)},
)
PROFILE = EventType(
    name="member profile", key_name="member_id",
    fields={"name": (STRING, True), "title": (STRING, False), "company": (STRING, False),
            "location": (STRING, False), "zip": (STRING, False)},
)
SETTINGS = EventType(
    name="member settings", key_name="member_id",
    fields={"language": (STRING, False), "email_notifications": (BOOL, False),
            "visibility": (STRING, False)},
    choices=(("visibility", ("public", "connections", "private")),),
)
AD_IMPRESSION = EventType(
    name="ad impression", key_name="impression_id", key_field="impression_id",
    fields={"impression_id": (STRING, True), "ad_id": (STRING, True), "member_id": (STRING, True),
            "shown_at": (TIMESTAMP, True)},
)
AD_CLICK = EventType(
    name="ad click", key_name="impression_id", key_field="impression_id",
    fields={"click_id": (STRING, True), "impression_id": (STRING, True), "member_id": (STRING, True),
            "clicked_at": (TIMESTAMP, True)},
)


def parse_timestamp(text: str) -> datetime | None:
    """An ISO-8601 string with a UTC offset as an aware UTC datetime; None if it is not one."""
    try:
        ts = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    if ts.tzinfo is None:
        return None
    return ts.astimezone(timezone.utc)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def decode_key(et: EventType, key: bytes | None) -> tuple[str | None, str | None]:
    """(key text, None) or (None, reason)."""
    if key is None:
        return None, f"null key: {et.name} records are keyed by {et.key_name}"
    try:
        text = bytes(key).decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"key is not UTF-8 ({e.reason} at byte {e.start})"
    if not text:
        return None, f"empty key: {et.name} records are keyed by {et.key_name}"
    return text, None


def parse_value(et: EventType, key: str, value: bytes | None) -> tuple[dict[str, Any] | None, str | None]:
    """Parse one record's value (key already decoded): (typed row, None) or (None, reason)."""
    if value is None:
        return None, f"null value: {et.name} events have no tombstones"
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"value is not UTF-8 ({e.reason} at byte {e.start})"
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        return None, f"value is not JSON: {e}"
    if not isinstance(obj, dict):
        return None, f"value is not a JSON object but {type(obj).__name__}"
    row: dict[str, Any] = {}
    for name, (typ, required) in et.fields.items():
        raw = obj.get(name)
        if raw is None:
            if required:
                return None, f"field {name!r} is missing"
            row[name] = None
            continue
        if typ == BOOL:
            if not isinstance(raw, bool):
                return None, f"field {name!r} must be true or false, got {raw!r}"
            row[name] = raw
        elif not isinstance(raw, str):
            return None, f"field {name!r} must be a string, got {type(raw).__name__} {raw!r}"
        elif not _is_utf8(raw):
            return None, f"field {name!r} holds invalid unicode (a lone surrogate): {raw!r}"
        elif typ == TIMESTAMP:
            ts = parse_timestamp(raw)
            if ts is None:
                return None, f"field {name!r} is not an ISO-8601 timestamp with a UTC offset: {raw!r}"
            row[name] = ts
        else:
            row[name] = raw
    for name, allowed in et.choices:
        if row.get(name) is not None and row[name] not in allowed:
            return None, f"field {name!r} is {row[name]!r}, expected one of {', '.join(allowed)}"
    ident = et.key_field or et.key_name
    if ident in obj and obj[ident] != key:
        return None, f"field {ident!r} is {obj[ident]!r} but the record key is {key!r}"
    return row, None


def parse_record(et: EventType, key: bytes | None,
                 value: bytes | None) -> tuple[dict[str, Any] | None, str | None]:
    """Parse one record: (typed row, None) or (None, reject reason). Never raises."""
    text, error = decode_key(et, key)
    if error:
        return None, error
    return parse_value(et, text, value)


# -- the schema of parsed records (`jobs.lib.source.event_columns.parse_events`) ------------------------

#: Columns passed through from the Kafka source next to the parsed fields.
POSITION_FIELDS = [pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
                   pa.field("offset", pa.int64()), pa.field("timestamp", pa.timestamp("us", tz="UTC"))]
RAW_FIELDS = [pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("error", pa.string())]


def parsed_schema(et: EventType) -> pa.Schema:
    """Schema of `jobs.lib.source.event_columns.parse_events` output: typed fields, source position, and for
    rejects raw key, value and the reason (`error` is null exactly for the rows that parsed)."""
    return pa.schema(list(et.arrow_schema()) + POSITION_FIELDS + RAW_FIELDS)


def parsed_ddl(et: EventType) -> str:
    return (et.spark_ddl() + ", topic string, partition int, offset bigint, timestamp timestamp, "
            "key binary, value binary, error string")
