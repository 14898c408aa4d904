"""Kafka record values parsed once in the JVM, exactly as a Python parser would.

A job's records are JSON objects; its exact parser is Python (``json`` plus its own checks), whose
answers (the typed fields, or the reject reason) are the contract. `parse_json_values` gets those
answers with the work in the JVM: each value is read ONCE by kappa's JVM function
(``kappa_json_fields``, `jobs/lib/source/jvm/JsonFields.java`: strict UTF-8, then Jackson's streaming
parser with its strict defaults), which gives each named top-level field's JSON type and text, and the
job's `judge` says from those whether the JVM's reading is the exact one and what the fields are. The
function gives nothing (null) for a value whose reading might differ from Python's: bytes that are not
strict UTF-8 or start with a byte-order mark, JSON Jackson refuses (malformed, ``NaN``, control
characters in strings), anything but one object followed by JSON whitespace, a named field given twice,
a named field's string with a lone surrogate, nesting past 64 levels, a number past 1000 characters. Those
records, and those `judge` does not vouch for (a field of the wrong type, whose reason the exact parser
words), go through the exact parser in a vectorised Arrow UDF; the rest never leave the JVM.

Why one pass and no filter: the optimizer pushes a filter below the projection it reads and copies
the projected expressions into it, so a parse that a filter splits into a JVM branch and a Python
branch ran in both, once per reference (eleven times per record). Here every record takes the same
projections, which the optimizer never duplicates an expensive expression into; the UDF runs over
every record but gets the key and value of those it must parse and nulls for the rest, so the Arrow
batches it reads are small and its loop skips the rest. The executed plan calls the parse once
(`PARSE_CALL`; a test counts it).

Under kappa's runner of an `Upserts` job (`deferring`), the UDF is left out: a record the JVM cannot
vouch for gets null fields and ``error`` `PENDING`, rides the batch's one aggregation as a reject of its
own, and the runner gives only those records to the job's function once more, outside `deferring`,
where the exact parser reads them (`jobs.lib.contract.runner.group_micro_batch`). So no record passes
through Spark's Python runner unless it must: with the UDF in the plan, every record did (ArrowEvalPython
buffers each row while its batch goes to Python), about 4 of 25 executor CPU-s of `kappa bench reprocess`.

The design it replaced read each value into a Spark variant (``try_parse_json``) and the fields back
with ``schema_of_variant`` and ``try_variant_get``, behind a UTF-8 and a brace screen: 17.7 executor
CPU-s for 2M profiles where this reading takes 4.7, and ``from_json`` 10.1 (`kappa bench parse`, one run).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Hashable, Iterator, Sequence

__all__ = ["parse_json_values", "Fields", "PARSE_CALL", "PENDING", "deferring"]

#: How the parse appears in an executed plan (the tests count it: once per record).
PARSE_CALL = "kappa_json_fields("
#: The ``error`` of a record left to the exact parser under `deferring` (never a reject's reason).
PENDING = "kappa: left to the exact parser"
_DEFERRED: ContextVar[list | None] = ContextVar("kappa_json_values_deferred", default=None)


@contextmanager
def deferring() -> Iterator[list[int]]:
    """Within: `parse_json_values` leaves the records the JVM cannot vouch for to the caller (null fields,
    ``error`` `PENDING`) instead of parsing them in an Arrow UDF over every record. Yields the list to which
    each parse made within appends the id of its ``error`` column (Spark's expression id), by which the
    caller finds it in the job's plan."""
    token = _DEFERRED.set([])
    try:
        yield _DEFERRED.get()
    finally:
        _DEFERRED.reset(token)


class Fields:
    """A record's value as `parse_json_values`' `judge` sees it: each named top-level field's JSON type
    (``"string"``, ``"boolean"``, ``"null"``, ``"other"``; null when absent) and text (a string's, a
    boolean's ``true``/``false``; else null), as columns."""

    def __init__(self, doc: Any, names: Sequence[str]):
        self._doc, self._at = doc, {n: i for i, n in enumerate(names)}

    @property
    def parsed(self) -> Any:
        """True where the JVM read the value (false where it left it to the exact parser, or it is null)."""
        return self._doc.isNotNull()

    def type(self, name: str) -> Any:
        return self._doc["t"][self._at[name]]

    def text(self, name: str) -> Any:
        return self._doc["v"][self._at[name]]


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


def parse_json_values(records: Any, *, keep: Sequence[str], fields: Sequence[str], key_ok: Callable[[], Any],
                      judge: Callable[[Fields], tuple[Any, dict]], exact: Callable[[bytes | None, bytes | None], dict],
                      exact_ddl: str, name: Hashable) -> Any:
    """Kafka rows -> the `keep` columns, one column per field `judge` names, and ``error`` (the reject
    reason; null for a valid record).

    `judge(doc)` gets the value as the JVM read it (`Fields`: the top-level `fields`' types and texts;
    nothing where the value is null or the JVM leaves it to `exact`) and returns ``(ok, {field: typed
    column})``: ``ok`` true where those columns are exactly what `exact` would give. Rows where `key_ok()` and ``ok`` hold take them; every other
    row takes ``exact(key, value)`` (a dict of the fields and ``error``, read with `exact_ddl` and cast to
    the types of `judge`'s columns).

    The expressions are made once per Spark context (`jobs.lib.runtime.columns`) under `name`, which
    must name what `judge`, `exact` and `key_ok` depend on; the input's columns are part of the key."""
    from jobs.lib.runtime.columns import built_once
    from jobs.lib.runtime.jvm import register

    bad = [f for f in fields if not f or "," in f]
    if bad:
        raise ValueError(f"parse_json_values: field names {bad!r} cannot be read (empty, or with a comma): name each "
                         f"field as the JSON object spells it, and read a field whose name holds a comma from the "
                         f"record's value yourself")
    register(records.sparkSession)
    need = list(dict.fromkeys([*keep, "key", "value"]))
    made: list[tuple[list[list[Any]], Any]] = []   # what `_steps` made for this call, if it ran
    deferred = _DEFERRED.get()

    def build() -> list[list[Any]]:
        made.append(_steps(records, need, keep, fields, key_ok, judge, exact, exact_ddl, defer=deferred is not None))
        return made[0][0]

    steps = built_once(("json_values", name, tuple(keep), tuple(fields), tuple(records.columns), deferred is not None),
                       build)
    if made:
        # Built just now over these records: the first three selects are `judged`, analysed already. Each
        # select is an analysis of the whole plan, slow on a fresh JVM (a query's first call: its probe).
        own, judged = made[0]
        records = judged.select(*own[-1])
    else:
        for columns in steps:
            records = records.select(*columns)
    if deferred is not None:
        deferred.append(_column_id(records, "error"))
    return records


def _column_id(df: Any, name: str) -> int:
    """Spark's expression id of `df`'s output column `name` (its analysed plan's)."""
    out = df._jdf.queryExecution().analyzed().output()
    return next(out.apply(i).exprId().id() for i in range(out.size()) if out.apply(i).name() == name)


def _steps(records: Any, need: list[str], keep: Sequence[str], fields: Sequence[str], key_ok: Callable[[], Any],
           judge: Callable[[Fields], tuple[Any, dict]], exact: Callable[[bytes | None, bytes | None], dict],
           exact_ddl: str, defer: bool = False) -> tuple[list[list[Any]], Any]:
    """`parse_json_values`' selects, in order (the parse, the verdict, its fields, the answer), and `records`
    with the first three of them. With `defer`, the answer leaves what `exact` would read to the caller
    (`PENDING`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.functions import arrow_udf

    from jobs.lib.runtime.jvm import JSON_FIELDS

    value = F.col("value")
    first = [*need, F.call_function(JSON_FIELDS, value, F.lit(",".join(fields))).alias("__doc")]
    ok, typed = judge(Fields(F.col("__doc"), fields))
    verdict = F.struct(F.coalesce(key_ok() & ok, F.lit(False)).alias("ok"),
                       F.struct(*[c.alias(n) for n, c in typed.items()]).alias("v"))
    second, third = [*need, verdict.alias("__j")], [*need, "__j.*"]
    judged = records.select(*first).select(*second).select(*third)
    py = ~F.col("ok")
    if defer:
        last = [*keep, *[F.when(~py, F.col(f"v.{n}")).alias(n) for n in typed],
                F.when(py, F.lit(PENDING)).alias("error")]
        return [first, second, third, last], judged
    exact_udf = arrow_udf(_exact_rows(exact), "string")
    slow = F.from_json(exact_udf(py, F.when(py, F.col("key")), F.when(py, value)), exact_ddl)
    types = {f.name: f.dataType for f in judged.schema["v"].dataType.fields}
    last = [*keep, *[F.when(py, slow[n].cast(types[n])).otherwise(F.col(f"v.{n}")).alias(n) for n in typed],
            F.when(py, slow["error"]).alias("error")]
    return [first, second, third, last], judged
