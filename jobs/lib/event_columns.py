"""The seed events parsed in the JVM: Spark's Kafka rows in, `jobs.lib.events.parsed_ddl` rows out.

`parse_events(records, et)` gives exactly what `jobs.lib.events.parse_record` gives for every
record (the typed fields, or the reject reason), with the work in Spark SQL wherever the JVM can
vouch for the answer: ``try_parse_json`` into a variant, each field's type from
``schema_of_variant``, timestamps in the strict ISO-8601 form with an offset
(``2024-05-01T10:15:00Z``, ``+02:00``, fractions up to microseconds) through ``try_cast``, the
choices and the key field checked as expressions. A record the JVM path cannot vouch for goes to
the exact parser (`parse_record`, Python's json and ``datetime.fromisoformat``) in a pandas UDF over
those rows only: a key or value that is null, empty or not UTF-8, JSON the JVM refuses (malformed,
duplicate keys), ``\\u`` escapes or control characters, more than one ``}``, a field of the wrong
type, a timestamp in another form, a value outside its choices, a key field that differs from the
key. So the reasons are the exact parser's, and the valid records of a realistic log never leave
the JVM.
"""

from __future__ import annotations

import json
from typing import Any

from jobs.lib.events import BOOL, STRING, TIMESTAMP, EventType, parse_record

__all__ = ["parse_events", "ISO_TIMESTAMP"]

#: The timestamps the JVM path takes (anything else goes to ``datetime.fromisoformat``).
ISO_TIMESTAMP = r"^(?!0000)\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$"
_POSITION = ["topic", "partition", "offset", "timestamp"]
_SPARK = {STRING: "string", TIMESTAMP: "timestamp", BOOL: "boolean"}


def _slow_ddl(et: EventType) -> str:
    return ", ".join(f"{n} string" for n in et.fields) + ", error string"


def _slow_rows(et: EventType, keys: Any, values: Any) -> Any:
    """pandas UDF body: `parse_record` over the rows the JVM path sent here, each row's fields (as
    strings: timestamps in ISO form, booleans as true/false) and reason as one JSON object."""
    import pandas as pd

    out = []
    for key, value in zip(keys, values):
        row, error = parse_record(et, None if key is None else bytes(key), None if value is None else bytes(value))
        doc: dict[str, Any] = {"error": error}
        for name, (typ, _) in et.fields.items():
            v = None if row is None else row.get(name)
            doc[name] = v.isoformat() if typ == TIMESTAMP and v is not None else v
        out.append(json.dumps(doc))
    return pd.Series(out, dtype=object)


def parse_events(records: Any, et: EventType, key_as: str | None = None) -> Any:
    """Kafka source rows -> `jobs.lib.events.parsed_ddl(et)` rows: typed fields, position, and for a
    reject its raw key and value and the reason (`error` null exactly for the rows that parsed).
    With `key_as`, also the record key as text in a column of that name (for every valid row)."""
    from functools import partial

    from pyspark.sql import functions as F
    from pyspark.util import PythonEvalType

    text = F.col("value").cast("string")
    base = records.select("key", "value", *_POSITION).withColumn(
        "__doc", F.when(F.col("value").isNotNull(), F.expr("try_parse_json(cast(value AS string))")))

    def field(name: str) -> Any:
        return F.variant_get(F.col("__doc"), f"$.{name}", "variant")

    def typ(name: str) -> Any:
        return F.schema_of_variant(field(name))

    def as_string(name: str) -> Any:
        return F.expr(f"try_variant_get(__doc, '$.{name}', 'string')")

    ok = (F.col("key").isNotNull() & F.expr("is_valid_utf8(key)") & (F.length("key") > 0)
          & F.col("value").isNotNull() & F.expr("is_valid_utf8(value)")
          & ~text.rlike(r"[\x00-\x1f]|\\u") & F.ltrim(text).startswith("{")
          & (F.locate("}", text) == F.length(F.rtrim(text))) & F.col("__doc").isNotNull())
    typed = {}
    for name, (t, required) in et.fields.items():
        missing = typ(name).isNull() | (typ(name) == "VOID")
        want = "BOOLEAN" if t == BOOL else "STRING"
        right = F.coalesce(typ(name) == want, F.lit(False))
        ok = ok & (right if required else (missing | right))
        if t == TIMESTAMP:
            raw = as_string(name)
            value = F.expr(f"try_cast(try_variant_get(__doc, '$.{name}', 'string') AS timestamp)")
            ok = ok & (missing | (F.coalesce(raw.rlike(ISO_TIMESTAMP), F.lit(False)) & value.isNotNull()))
        elif t == BOOL:
            value = F.expr(f"try_variant_get(__doc, '$.{name}', 'boolean')")
        else:
            value = as_string(name)
        typed[name] = F.when(~missing, value)
    for name, allowed in et.choices:
        ok = ok & (typed[name].isNull() | typed[name].isin(*allowed))
    ident = et.key_field or et.key_name
    if ident in et.fields or et.key_field is None:
        present = typ(ident).isNotNull()     # a JSON null is present too (and not the key)
        same = F.coalesce((typ(ident) == "STRING") & (as_string(ident) == F.col("key").cast("string")), F.lit(False))
        ok = ok & (~present | same)
    checked = base.withColumn("__ok", F.coalesce(ok, F.lit(False)))
    keyed = [F.col("key").cast("string").alias(key_as)] if key_as else []
    fast = checked.where(F.col("__ok")).select(
        *keyed, *[typed[n].cast(_SPARK[t]).alias(n) for n, (t, _) in et.fields.items()], *_POSITION,
        F.lit(None).cast("binary").alias("key"), F.lit(None).cast("binary").alias("value"),
        F.lit(None).cast("string").alias("error"))
    slow_udf = F.pandas_udf(partial(_slow_rows, et), "string", PythonEvalType.SQL_SCALAR_PANDAS_UDF)
    parsed = F.from_json(slow_udf(F.col("key"), F.col("value")), _slow_ddl(et))
    slow = checked.where(~F.col("__ok")).select("key", "value", *_POSITION, parsed.alias("__p"))
    failed = F.col("__p.error").isNotNull()
    keyed = [F.when(~failed, F.col("key").cast("string")).alias(key_as)] if key_as else []
    slow = slow.select(
        *keyed, *[F.col(f"__p.{n}").cast(_SPARK[t]).alias(n) for n, (t, _) in et.fields.items()], *_POSITION,
        F.when(failed, F.col("key")).alias("key"), F.when(failed, F.col("value")).alias("value"),
        F.col("__p.error").alias("error"))
    return fast.unionByName(slow)
