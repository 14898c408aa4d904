"""What a new derivation changed: two tables joined on the pipeline's key, compared like with like.

Used by the validation report (a version against the serving one) and the rules preview (a
proposed ruleset against the served table).

Like with like: a row is compared only when both tables derived it from the same input. When the
tables carry the source position (`source_partition`, `source_offset`, which kappa's runner
MERGEs beside every `Upserts` job's rows), the same input is the same Kafka record; otherwise,
when a table keeps the raw input beside a derived column (`title_raw` -> `title`), it is equal
input columns. Rows whose input differs (a live update one version has read and the other not
yet) are counted apart (`rows_input_differs`), never as changes. So every change counted is the
new logic's.

Columns that record where a row came from (`source_*`) or are internal (`_*`) are not compared.
`changed_by_column` lists the derived columns (or, without raw columns, every compared one) and
any other column that changed.
`diff_rows` lists each changed value (key, column, old, new as text) for a pipeline's checks
(the `diff` table of `orchestrator.core.checks`); `schema_changes` names the columns added,
removed or retyped between the two tables.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TOP_CHANGES", "POSITION", "compare_tables", "diff_rows", "schema_changes"]

TOP_CHANGES = 10
#: The source position columns: equal in both tables means the same Kafka record.
POSITION = ("source_partition", "source_offset")


def _differs(a, b):
    import pyarrow.compute as pc

    ne = pc.fill_null(pc.not_equal(a, b), False)
    return pc.or_(ne, pc.xor(pc.is_null(a), pc.is_null(b)))


def _derived(common: list[str]) -> list[str]:
    """The columns derived from a raw one kept beside them (`title` of `title_raw`)."""
    return [c[:-4] for c in common if c.endswith("_raw") and c[:-4] in common]


def _plan(new, old, keys: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(common data columns, compared columns, input columns that must be equal)."""
    common = [c for c in new.column_names if c in old.column_names and c not in keys
              and not c.startswith("source_") and not c.startswith("_")]
    if all(p in new.column_names and p in old.column_names for p in POSITION):
        return common, common, list(POSITION)
    derived = _derived(common)
    if derived:
        return common, derived, [c for c in common if c not in derived]
    return common, common, []


def _joined(new, old, keys: list[str]):
    import pyarrow as pa
    import pyarrow.compute as pc

    common, compared, inputs = _plan(new, old, keys)
    cols = common + [p for p in inputs if p not in common]
    old_r = old.select(keys + cols).rename_columns(keys + [f"{c}__old" for c in cols])
    joined = new.select(keys + cols).join(old_r, keys=keys, join_type="inner")
    same = pa.array([True] * joined.num_rows, pa.bool_())
    for c in inputs:
        same = pc.and_(same, pc.invert(_differs(joined[c], joined[f"{c}__old"])))
    return joined, compared, inputs, same


def compare_tables(new, old, key_columns: list[str], top: int = TOP_CHANGES) -> dict[str, Any]:
    """Join two tables on the key and count what the new logic changed; see the module docstring.

    `top_changes` holds the values as pyarrow returns them; `Report.model_dump(mode="json")` makes them JSON.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = list(key_columns)
    joined, compared, inputs, same_input = _joined(new, old, keys)
    n = joined.num_rows
    any_change = pa.array([False] * n, pa.bool_())
    by_column: dict[str, int] = {}
    top_changes: dict[str, list[dict[str, Any]]] = {}
    for c in compared:
        d = pc.and_(_differs(joined[c], joined[f"{c}__old"]), same_input)
        by_column[c] = pc.sum(d).as_py() or 0
        any_change = pc.or_(any_change, d)
        if by_column[c]:
            pairs = pa.table({"old": joined[f"{c}__old"], "new": joined[c]}).filter(d)
            counts = pairs.group_by(["old", "new"], use_threads=False).aggregate([([], "count_all")])
            counts = counts.sort_by([("count_all", "descending"), ("old", "ascending"), ("new", "ascending")])
            top_changes[c] = [{"old": r["old"], "new": r["new"], "count": r["count_all"]}
                              for r in counts.slice(0, top).to_pylist()]
    # every column is compared; listed are the derived ones (`title` of `title_raw`) and any that changed
    keep = set(_derived(compared)) or set(compared)
    by_column = {c: n for c, n in by_column.items() if n or c in keep}
    same = pc.sum(same_input).as_py() or 0
    return {
        "compared_columns": compared, "input_columns": [c for c in inputs if c not in POSITION],
        "aligned": list(inputs) == list(POSITION), "rows_compared": n, "rows_same_input": same,
        "rows_changed": pc.sum(any_change).as_py() or 0,
        "rows_input_differs": (n - same) if inputs else 0,
        "keys_only_new": new.num_rows - n, "keys_only_serving": old.num_rows - n,
        "changed_by_column": by_column, "top_changes": top_changes,
    }


def diff_rows(new, old, key_columns: list[str]):
    """Every value the new logic changed: key columns, `column_name`, `old`, `new` (as text)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = list(key_columns)
    joined, compared, _inputs, same_input = _joined(new, old, keys)
    parts = []
    for c in compared:
        d = pc.and_(_differs(joined[c], joined[f"{c}__old"]), same_input)
        rows = joined.filter(d)
        parts.append(pa.table({**{k: rows[k] for k in keys},
                               "column_name": pa.array([c] * rows.num_rows, pa.string()),
                               "old": pc.cast(rows[f"{c}__old"], pa.string()),
                               "new": pc.cast(rows[c], pa.string())}))
    if parts:
        return pa.concat_tables(parts)
    key_fields = [new.schema.field(k) for k in keys]
    return pa.schema(key_fields + [pa.field(n, pa.string()) for n in ("column_name", "old", "new")]).empty_table()


def schema_changes(new_schema, old_schema) -> dict[str, Any]:
    """Columns added, removed and retyped (name -> [old type, new type]) from `old_schema` to `new_schema`."""
    new_t = {f.name: str(f.type) for f in new_schema}
    old_t = {f.name: str(f.type) for f in old_schema}
    return {"columns_added": [c for c in new_t if c not in old_t],
            "columns_removed": [c for c in old_t if c not in new_t],
            "columns_retyped": {c: [old_t[c], new_t[c]] for c in new_t if c in old_t and old_t[c] != new_t[c]}}
