"""Kafka record values parsed once in the JVM, exactly as a Python parser would.

A job's records are JSON objects; its exact parser is Python (``json`` plus its own checks), whose
answers (the typed fields, or the reject reason) are the contract. `parse_json_values` gets those
answers with the work in Spark SQL: each value is parsed ONCE with ``try_parse_json``, and the job's
`judge` says, from that variant, whether the JVM's reading is the exact one and what the fields are.
The few records it cannot vouch for (JSON the JVM refuses: malformed, duplicate keys, lone
surrogates, control characters in strings, ``NaN``; text after the first ``}``, which the JVM parser
would ignore; a field of the wrong type, whose reason the exact parser words) go through the exact
parser in a vectorised Arrow UDF; the rest never leave the JVM.

Why one pass and no filter: the optimizer pushes a filter below the projection it reads and copies
the projected expressions into it, so a parse that a filter splits into a JVM branch and a Python
branch ran in both, once per reference (eleven times per record). Here every record takes the same
projections, which the optimizer never duplicates an expensive expression into; the UDF runs over
every record but gets the key and value of those it must parse and nulls for the rest, so the Arrow
batches it reads are small and its loop skips the rest. The executed plan calls the parse once
(`PARSE_CALL`; a test counts it).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Hashable, Sequence

__all__ = ["parse_json_values", "BRACE_RULE", "PARSE_CALL"]

#: One ``}``, the object's last character (JSON whitespace may follow). The JVM parser stops after
#: the first value and ignores what follows; Python refuses it ("Extra data"): such text, and any
#: other with a ``}`` before the end (in a string, a nested object), is left to the exact parser.
#: ``\z``, not ``$``: Java's ``$`` also matches before a final line terminator such as U+2028.
BRACE_RULE = r"^[^}]*+\}[ \t\n\r]*+\z"
#: How the parse appears in an executed plan (the tests count it: once per record).
PARSE_CALL = "VariantExpressionEvalUtils.parseJson("


def _exact_rows(exact: Callable[[bytes | None, bytes | None], dict]) -> Callable[..., Any]:
    def rows(needs, keys, values):
        """Arrow UDF body: `exact` over the rows flagged in `needs` (JSON text per row, null elsewhere)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        out: list[str | None] = [None] * len(needs)
        for i in pc.indices_nonzero(pc.fill_null(needs, False)).to_pylist():
            key, value = keys[i].as_py(), values[i].as_py()
            out[i] = json.dumps(exact(None if key is None else bytes(key), None if value is None else bytes(value)))
        return pa.array(out, pa.string())
    return rows


def parse_json_values(records: Any, *, keep: Sequence[str], key_ok: Callable[[], Any],
                      judge: Callable[[Any], tuple[Any, dict]], exact: Callable[[bytes | None, bytes | None], dict],
                      exact_ddl: str, name: Hashable) -> Any:
    """Kafka rows -> the `keep` columns, one column per field `judge` names, and ``error`` (the reject
    reason; null for a valid record).

    `judge(doc)` gets the parsed value (a variant column, null where the value is null or the JVM
    refuses its text) and returns ``(ok, {field: typed column})``: ``ok`` true where those columns
    are exactly what `exact` would give. Rows where `key_ok()` and ``ok`` hold take them; every other
    row takes ``exact(key, value)`` (a dict of the fields and ``error``, read with `exact_ddl` and cast to
    the types of `judge`'s columns).

    The expressions are made once per Spark context (`jobs.lib.runtime.columns`) under `name`, which
    must name what `judge`, `exact` and `key_ok` depend on; the input's columns are part of the key."""
    from jobs.lib.runtime.columns import built_once

    need = list(dict.fromkeys([*keep, "key", "value"]))
    steps = built_once(("json_values", name, tuple(keep), tuple(records.columns)),
                       lambda: _steps(records, need, keep, key_ok, judge, exact, exact_ddl))
    for columns in steps:
        records = records.select(*columns)
    return records


def _steps(records: Any, need: list[str], keep: Sequence[str], key_ok: Callable[[], Any],
           judge: Callable[[Any], tuple[Any, dict]], exact: Callable[[bytes | None, bytes | None], dict],
           exact_ddl: str) -> list[list[Any]]:
    """`parse_json_values`' selects, in order: the parse, the verdict, its fields, the answer."""
    from pyspark.sql import functions as F
    from pyspark.sql.functions import arrow_udf

    value = F.col("value")
    parse = F.when(value.isNotNull() & F.expr("is_valid_utf8(value)") & value.cast("string").rlike(BRACE_RULE),
                   F.expr("try_parse_json(cast(value AS string))"))
    first = [*need, parse.alias("__doc")]
    ok, typed = judge(F.col("__doc"))
    verdict = F.struct(F.coalesce(key_ok() & ok, F.lit(False)).alias("ok"),
                       F.struct(*[c.alias(n) for n, c in typed.items()]).alias("v"))
    second, third = [*need, verdict.alias("__j")], [*need, "__j.*"]
    judged = records.select(*first).select(*second).select(*third)
    py = ~F.col("ok")
    exact_udf = arrow_udf(_exact_rows(exact), "string")
    slow = F.from_json(exact_udf(py, F.when(py, F.col("key")), F.when(py, value)), exact_ddl)
    types = {f.name: f.dataType for f in judged.schema["v"].dataType.fields}
    last = [*keep, *[F.when(py, slow[n].cast(types[n])).otherwise(F.col(f"v.{n}")).alias(n) for n in typed],
            F.when(py, slow["error"]).alias("error")]
    return [first, second, third, last]
