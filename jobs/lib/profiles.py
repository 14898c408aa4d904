"""The standardize job's transform: member-profile records in, standardized rows and rejects out, in Spark.

The input is Spark's Kafka source (key, value, topic, partition, offset, timestamp) of a compacted
topic keyed by member id (UTF-8); values are JSON profiles ``{"name", "title", "company",
"location", "updated_at"}`` (name required, the others strings or null, unknown fields ignored
whatever they hold); null values are tombstones. A record that cannot be used (no key, key not
UTF-8, invalid JSON, not an object, missing name, wrong types, a profile field given twice) is a
reject with its partition, offset and reason, and leaves the member as it was.

`parse_records` does this in the JVM: ``try_parse_json`` into a variant, the field types from
``schema_of_variant``, the fields with ``try_variant_get``. A value the JVM path cannot vouch for
goes to `parse_one`, the exact parser (Python's json), in a pandas UDF over those rows only: JSON
that the JVM refuses (malformed, duplicate keys, NaN), values with ``\\u`` escapes (lone
surrogates, escaped keys), control characters, bytes that are not UTF-8, or more than one ``}``
(where the JVM parser would stop at the first object and ignore what follows it). So the reasons
are the exact parser's, and a value is valid exactly when Python's json reads it as a profile;
a realistic changelog sends a few percent of its records that way (the rejects, mostly).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

__all__ = ["KEY_COLUMNS", "DELETED", "INPUT_COLUMNS", "PROFILE_FIELDS", "OUTPUT_SCHEMA", "OUTPUT_DDL",
           "REJECT_COLUMNS", "parse_one", "key_reason", "parse_records"]

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


_SLOW_DDL = ", ".join(f"{f} string" for f in PROFILE_FIELDS) + ", error string"


def _slow_rows(keys, values):
    """pandas UDF body: `parse_one` over the rows the JVM path sent here (see the module), each row's
    fields and reason as one JSON object (`_SLOW_DDL`; a struct result breaks on empty batches)."""
    import pandas as pd

    out = []
    for key, value in zip(keys, values):
        fields, reason = None, key_reason(key)
        if reason is None and value is not None:
            fields, reason = parse_one(bytes(value))
        doc = dict(zip(PROFILE_FIELDS, fields or (None,) * len(PROFILE_FIELDS)))
        doc["error"] = reason
        out.append(json.dumps(doc))
    return pd.Series(out, dtype=object)


def parse_records(records: Any) -> Any:
    """Kafka source rows -> one row per record: ``member_id``, the profile fields, ``error`` (the
    reject reason, else null), ``_deleted`` (a tombstone of a usable key), and the source columns.
    Spark (DataFrame functions, JVM) for what it can vouch for; `parse_one` for the rest."""
    from pyspark.sql import functions as F
    from pyspark.util import PythonEvalType

    text = F.col("value").cast("string")
    doc = F.expr("try_parse_json(cast(value AS string))")
    typ = {f: F.schema_of_variant(F.variant_get(F.col("__doc"), f"$.{f}", "variant")) for f in PROFILE_FIELDS}
    string_or_null = [(t.isNull() | t.isin("STRING", "VOID")) for f, t in typ.items() if f != "name"]
    trimmed = F.rtrim(text)
    vouched = (F.col("key").isNotNull() & F.expr("is_valid_utf8(key)")
               & (F.col("value").isNull()
                  | (F.expr("is_valid_utf8(value)")
                     & ~text.rlike(r"[\x00-\x1f]|\\u")
                     & F.ltrim(text).startswith("{")
                     & (F.locate("}", text) == F.length(trimmed))
                     & F.col("__doc").isNotNull())))
    base = records.select(*INPUT_COLUMNS).withColumn("__doc", F.when(F.col("value").isNotNull(), doc))
    checked = base.withColumn("__vouched", vouched)
    fast = checked.where(F.col("__vouched"))
    fields_ok = F.coalesce(typ["name"] == "STRING", F.lit(False))   # a missing name has no type (null)
    for ok in string_or_null:
        fields_ok = fields_ok & ok
    fast = fast.where(F.col("value").isNull() | fields_ok).select(
        *INPUT_COLUMNS, *[F.expr(f"try_variant_get(__doc, '$.{f}', 'string')").alias(f) for f in PROFILE_FIELDS],
        F.lit(None).cast("string").alias("error"))
    # the rest: not vouched for, or vouched JSON whose field types are wrong (parse_one names the field)
    rest = checked.where(~F.col("__vouched") | (F.col("value").isNotNull() & ~fields_ok))
    slow_udf = F.pandas_udf(_slow_rows, "string", PythonEvalType.SQL_SCALAR_PANDAS_UDF)
    slow = rest.select(*INPUT_COLUMNS, F.from_json(slow_udf(F.col("key"), F.col("value")), _SLOW_DDL).alias("__p")).select(
        *INPUT_COLUMNS, *[F.col(f"__p.{f}").alias(f) for f in PROFILE_FIELDS], F.col("__p.error").alias("error"))
    rows = fast.unionByName(slow)
    return rows.select(
        F.when(F.col("key").isNotNull() & F.expr("is_valid_utf8(key)"), F.col("key").cast("string")).alias("member_id"),
        *PROFILE_FIELDS, "error",
        (F.col("error").isNull() & F.col("value").isNull()).alias(DELETED),
        *INPUT_COLUMNS)
