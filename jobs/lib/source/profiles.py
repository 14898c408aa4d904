"""The standardize job's transform: member-profile records in, standardized rows and rejects out, in Spark.

The input is Spark's Kafka source (key, value, topic, partition, offset, timestamp) of a compacted
topic keyed by member id (UTF-8); values are JSON profiles ``{"name", "title", "company",
"location", "updated_at"}`` (name required, the others strings or null, unknown fields ignored
whatever they hold); null values are tombstones. A record that cannot be used (no key, key not
UTF-8, invalid JSON, not an object, missing name, wrong types, a profile field given twice) is a
reject with its partition, offset and reason, and leaves the member as it was.

`parse_records` does this in the JVM, reading each value once (`jobs.lib.source.json_values`: the
profile fields' JSON types and strings, from kappa's strict JSON reading in Java). A value the JVM
cannot vouch for goes to `parse_one`, the exact parser (Python's json): in kappa's runner, in a second
pass over those records alone (`jobs.lib.contract.runner.group_micro_batch`), elsewhere in an Arrow UDF
that parses those rows only: JSON that the JVM refuses (malformed, a profile field twice, a lone
surrogate in one, control characters in strings, NaN, anything after the object), bytes that are not
UTF-8, or a profile field of the wrong type. So the reasons are the exact parser's, and a value is valid exactly when Python's json
reads it as a profile; a realistic changelog sends a few tenths of a percent of its records that way
(the rejects, mostly).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from jobs.lib.source.json_values import parse_json_values

__all__ = ["KEY_COLUMNS", "DELETED", "INPUT_COLUMNS", "PROFILE_FIELDS", "OUTPUT_SCHEMA", "OUTPUT_DDL",
           "REJECT_COLUMNS", "parse_one", "key_reason", "judge_profile", "parse_records"]

KEY_COLUMNS = ["member_id"]
#: The boolean column of a row to upsert that marks a key to delete (never written to the table).
DELETED = "_deleted"
INPUT_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp"]
PROFILE_FIELDS = ("name", "title", "company", "location", "updated_at")
OUTPUT_SCHEMA = pa.schema([
    ("member_id", pa.string()),
    ("name", pa.string()),
    ("title_raw", pa.string()),
    ("title", pa.string()),
    ("company_raw", pa.string()),
    ("company", pa.string()),
    ("location", pa.string()),
    ("source_partition", pa.int32()),
    ("source_offset", pa.int64()),
    ("source_timestamp", pa.timestamp("us", tz="UTC")),
])
OUTPUT_DDL = ("member_id string, name string, title_raw string, title string, company_raw string, company string, "
              "location string, source_partition int, source_offset bigint, source_timestamp timestamp")
#: The rejects table: the raw record, where it is in the log, why it was refused, the micro-batch.
REJECT_COLUMNS = ["key", "value", "topic", "partition", "offset", "error", "batch_id"]


def _json_type(v) -> str:
    if isinstance(v, dict):  # _Object too (the strict decoder's objects)
        return "object"
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(v), "number")


class _Object(dict):
    """A decoded JSON object that remembers its duplicated keys (pyarrow rejects those of the schema)."""

    __slots__ = ("duplicates",)


def _object_pairs(pairs):
    obj = _Object(pairs)
    if len(obj) == len(pairs):
        obj.duplicates = ()
    else:
        seen: set[str] = set()
        obj.duplicates = {k for k, _ in pairs if k in seen or seen.add(k)}
    return obj


_PLAIN = json.JSONDecoder()
_BOM = "Unexpected UTF-8 BOM (decode using utf-8-sig)"
_STRICT = json.JSONDecoder(object_pairs_hook=_object_pairs)


def parse_one(value: bytes) -> tuple[tuple | None, str | None]:
    """Parse and validate one profile value the slow, exact way: (fields, None) or (None, reason).

    Agrees with the pyarrow path: UTF-8 required, unknown fields ignored whatever they hold, a
    profile field given twice is an error.
    """
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"invalid JSON: not UTF-8 at byte {e.start}"
    if text.startswith("\ufeff"):   # json.loads' own refusal (the decoder's would be "Expecting value")
        return None, f"invalid JSON: {json.JSONDecodeError(_BOM, text, 0)}"
    maybe_twice = "\\u" in text or any(text.count(f'"{f}"') > 1 for f in PROFILE_FIELDS)
    try:
        doc = (_STRICT if maybe_twice else _PLAIN).decode(text)
    except (ValueError, RecursionError) as e:
        return None, f"invalid JSON: {e}"
    if not isinstance(doc, dict):
        return None, f"not a JSON object: {_json_type(doc)}"
    twice = getattr(doc, "duplicates", ())
    for f in PROFILE_FIELDS:  # the first in this order, not the set's (which varies between processes)
        if f in twice:
            return None, f"{f}: given twice"
    out = []
    for f in PROFILE_FIELDS:
        v = doc.get(f)
        if v is None:
            if f == "name":
                return None, "name: missing"
        elif not isinstance(v, str):
            expected = "a string" if f == "name" else "a string or null"
            return None, f"{f}: expected {expected}, got {_json_type(v)}"
        else:
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return None, f"{f}: invalid unicode (lone surrogate)"
        out.append(v)
    return tuple(out), None


def key_reason(key: bytes | None) -> str | None:
    """Why a Kafka key cannot be a member id, or None when it can."""
    if key is None:
        return "no key"
    try:
        key.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"key is not UTF-8 (byte {e.start})"
    return None


_EXACT_DDL = ", ".join(f"{f} string" for f in PROFILE_FIELDS) + ", error string"


def _exact(key: bytes | None, value: bytes | None) -> dict:
    """`key_reason` and `parse_one` for one record, as the fields and ``error`` (`parse_json_values`)."""
    fields, reason = None, key_reason(key)
    if reason is None and value is not None:
        fields, reason = parse_one(value)
    return {**dict(zip(PROFILE_FIELDS, fields or (None,) * len(PROFILE_FIELDS))), "error": reason}


def judge_profile(doc: Any) -> tuple[Any, dict]:
    """The JVM's reading (`jobs.lib.source.json_values.Fields`) is exact for a tombstone, and for an object
    whose name is a string and whose other profile fields are strings, null or absent; the fields are
    then the object's strings."""
    from pyspark.sql import functions as F

    ok = F.coalesce(doc.type("name") == "string", F.lit(False))   # a missing name has no type (null)
    for f in PROFILE_FIELDS[1:]:
        ok = ok & (doc.type(f).isNull() | doc.type(f).isin("string", "null"))
    return F.col("value").isNull() | (doc.parsed & ok), {f: doc.text(f) for f in PROFILE_FIELDS}


def _key_ok() -> Any:
    from pyspark.sql import functions as F

    return F.col("key").isNotNull() & F.expr("is_valid_utf8(key)")


def _output_columns() -> list[Any]:
    from pyspark.sql import functions as F

    return [F.when(_key_ok(), F.col("key").cast("string")).alias("member_id"), *PROFILE_FIELDS, "error",
            (F.col("error").isNull() & F.col("value").isNull()).alias(DELETED), *INPUT_COLUMNS]


def parse_records(records: Any) -> Any:
    """Kafka source rows -> one row per record: ``member_id``, the profile fields, ``error`` (the
    reject reason, else null), ``_deleted`` (a tombstone of a usable key), and the source columns.
    Each value is parsed once, in the JVM; `parse_one` decides what the JVM cannot vouch for
    (`jobs.lib.source.json_values`). The expressions are made once per Spark context."""
    from jobs.lib.runtime.columns import built_once

    rows = parse_json_values(records.select(*INPUT_COLUMNS), keep=INPUT_COLUMNS, fields=PROFILE_FIELDS,
                             key_ok=_key_ok, judge=judge_profile,
                             exact=_exact, exact_ddl=_EXACT_DDL, name="profiles")
    return rows.select(*built_once(("profiles", "output"), _output_columns))
