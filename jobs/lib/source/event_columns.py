"""The seed events parsed in the JVM: Spark's Kafka rows in, `jobs.lib.source.events.parsed_ddl` rows out.

`parse_events(records, et)` gives exactly what `jobs.lib.source.events.parse_record` gives for every
record (the typed fields, or the reject reason), with the work in Spark SQL wherever the JVM can
vouch for the answer: kappa's strict JSON reading in Java gives each field's JSON type and text,
timestamps in the strict ISO-8601 form with an offset
(``2024-05-01T10:15:00Z``, ``+02:00``, fractions up to microseconds) through ``try_cast``, the
choices and the key field checked as expressions, each value parsed once
(`jobs.lib.source.json_values`). A record the JVM path cannot vouch for goes to the exact parser
(`parse_record`, Python's json and ``datetime.fromisoformat``) in an Arrow UDF over those rows only: a
key or value that is null, empty or not UTF-8, JSON the JVM refuses (malformed, a field given twice, a
lone surrogate in one, control characters in strings, anything after the object), a field of the wrong type, a
timestamp in another form, a value outside its choices, a key field that differs from the key. So the
reasons are the exact parser's, and the valid records of a realistic log never leave the JVM.
"""

from __future__ import annotations

from typing import Any

from jobs.lib.source.events import BOOL, STRING, TIMESTAMP, EventType, parse_record

__all__ = ["parse_events", "ISO_TIMESTAMP"]

#: The timestamps the JVM path takes (anything else goes to ``datetime.fromisoformat``).
ISO_TIMESTAMP = r"^(?!0000)\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$"
_POSITION = ["topic", "partition", "offset", "timestamp"]
_SPARK = {STRING: "string", TIMESTAMP: "timestamp", BOOL: "boolean"}


def _exact_ddl(et: EventType) -> str:
    return ", ".join(f"{n} string" for n in et.fields) + ", error string"


def _exact(et: EventType, key: bytes | None, value: bytes | None) -> dict:
    """`parse_record` for one record, as its fields (strings: timestamps in ISO form, booleans as
    true/false) and ``error`` (`jobs.lib.source.json_values.parse_json_values`)."""
    row, error = parse_record(et, key, value)
    doc: dict[str, Any] = {"error": error}
    for name, (typ, _) in et.fields.items():
        v = None if row is None else row.get(name)
        doc[name] = v.isoformat() if typ == TIMESTAMP and v is not None else v
    return doc


def _names(et: EventType) -> list[str]:
    """The top-level fields `_judge` reads: the event's, and the key field if it is not one of them."""
    ident = et.key_field or et.key_name
    return list(dict.fromkeys([*et.fields, ident]))


def _judge(et: EventType, doc: Any) -> tuple[Any, dict]:
    """Where the JVM's reading of `doc` (`jobs.lib.source.json_values.Fields`) is exact (types, timestamps
    in the strict form, choices, the key field equal to the key), and the typed fields."""
    from pyspark.sql import functions as F

    ok = doc.parsed
    typed = {}
    for name, (t, required) in et.fields.items():
        missing = doc.type(name).isNull() | (doc.type(name) == "null")
        want = "boolean" if t == BOOL else "string"
        right = F.coalesce(doc.type(name) == want, F.lit(False))
        ok = ok & (right if required else (missing | right))
        raw = doc.text(name)
        if t == TIMESTAMP:
            value = raw.try_cast("timestamp")
            ok = ok & (missing | (F.coalesce(raw.rlike(ISO_TIMESTAMP), F.lit(False)) & value.isNotNull()))
        elif t == BOOL:
            value = raw == "true"
        else:
            value = raw
        typed[name] = F.when(~missing, value).cast(_SPARK[t])
    for name, allowed in et.choices:
        ok = ok & (typed[name].isNull() | typed[name].isin(*allowed))
    ident = et.key_field or et.key_name
    if ident in et.fields or et.key_field is None:
        present = doc.type(ident).isNotNull()     # a JSON null is present too (and not the key)
        same = F.coalesce((doc.type(ident) == "string") & (doc.text(ident) == F.col("key").cast("string")),
                          F.lit(False))
        ok = ok & (~present | same)
    return ok, typed


def parse_events(records: Any, et: EventType, key_as: str | None = None) -> Any:
    """Kafka source rows -> `jobs.lib.source.events.parsed_ddl(et)` rows: typed fields, position, and for a
    reject its raw key and value and the reason (`error` null exactly for the rows that parsed).
    With `key_as`, also the record key as text in a column of that name (for every valid row)."""
    from functools import partial

    from pyspark.sql import functions as F

    from jobs.lib.source.json_values import parse_json_values

    def key_ok() -> Any:
        return F.col("key").isNotNull() & F.expr("is_valid_utf8(key)") & (F.length("key") > 0)

    rows = parse_json_values(records.select("key", "value", *_POSITION), keep=["key", "value", *_POSITION],
                             fields=_names(et), key_ok=key_ok, judge=partial(_judge, et), exact=partial(_exact, et),
                             exact_ddl=_exact_ddl(et), name=("events", repr(et)))
    failed = F.col("error").isNotNull()
    keyed = [F.when(~failed, F.col("key").cast("string")).alias(key_as)] if key_as else []
    return rows.select(*keyed, *et.fields, *_POSITION, F.when(failed, F.col("key")).alias("key"),
                       F.when(failed, F.col("value")).alias("value"), "error")
