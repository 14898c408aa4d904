"""The validation report of a version against the version its alias serves now.

What an operator wants to see before a flip: how many keys each table holds (a rebuild from
the same log should hold the same keys, within the pipeline's tolerance), how many input
records the new version rejected, and what the new derivation changed: the rows whose derived
values differ, and the most frequent changes old -> new with their counts.

The two Delta tables are joined on the pipeline's key with pyarrow. When a table keeps the raw
input beside a derived column (`title_raw` -> `title`), the comparison is attributed: a row
counts as changed by the new rules only when its input columns are equal in both tables and a
derived column differs; rows whose input differs (live updates that one version has read and
the other not yet) are counted apart. Columns that record where a row came from (`source_*`)
or are internal (`_*`) are not compared.

Compaction takes something away that no reprocess can give back: once the cleaner has run, a key
whose latest record is malformed has lost its earlier valid value from the log. The serving
version still holds that value (it read it before the cleaner ran); the new version rejects the
malformed record and has no row for the key. Such keys are counted on their own line
(`keys_lost_to_compaction`), not as keys only in the serving table and not in the key-count check.

The report is saved as JSON beside the version (`<state_dir>/<pipeline>/v<N>/report.json`).
"""

from __future__ import annotations

import math
import time
from typing import Any

from pydantic import BaseModel, Field, computed_field, field_serializer

from orchestrator.core.exceptions import KappaError, SinkError
from orchestrator.core.files import write_json_atomic
from orchestrator.core.kappa import Kappa

__all__ = ["Report", "validation_report", "compare_tables", "TOP_CHANGES"]

TOP_CHANGES = 10
_UNSET: Any = object()


class Report(BaseModel):
    """The validation report of one version; `ok` and `problems` are what promote checks."""

    pipeline: str
    version: int
    serving_version: int | None
    alias: str
    generated_at: float
    keys_new: int
    keys_serving: int | None
    key_delta_ratio: float | None
    key_count_tolerance: float
    key_count_ok: bool | None              # None: nothing served yet, no comparison
    offsets_read: int                      # records read, by offsets (an upper bound on compacted logs)
    rejects: int
    reject_rate: float
    max_reject_rate: float
    reject_rate_ok: bool
    rules_version: str | None = None
    serving_rules_version: str | None = None
    compared_columns: list[str] = Field(default_factory=list)
    input_columns: list[str] = Field(default_factory=list)
    rows_compared: int = 0
    rows_changed: int = 0
    rows_input_differs: int = 0
    keys_only_new: int = 0
    keys_only_serving: int = 0
    #: Keys the serving version has and this one cannot: their latest record in the log is malformed
    #: (in this version's rejects) and the cleaner removed their earlier valid value from the log.
    #: Not a change of the new logic; left out of keys_only_serving and of the key-count check.
    keys_lost_to_compaction: int = 0
    changed_by_column: dict[str, int] = Field(default_factory=dict)
    top_changes: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    path: str | None = None

    @field_serializer("key_delta_ratio", when_used="json")
    def _infinite_ratio_as_text(self, ratio: float | None) -> float | str | None:
        """Strict JSON has no infinity: a serving table with no keys gives the ratio "inf"."""
        return "inf" if ratio is not None and math.isinf(ratio) else ratio

    @computed_field
    @property
    def ok(self) -> bool:
        return self.key_count_ok is not False and self.reject_rate_ok

    @computed_field
    @property
    def problems(self) -> list[str]:
        out = []
        if self.key_count_ok is False:
            out.append(
                f"key count of v{self.version} ({self.keys_new}) differs from serving v{self.serving_version} "
                f"({self.keys_serving}) by {self.key_delta_ratio:.2%}, over the tolerance "
                f"{self.key_count_tolerance:.2%} (key_count_tolerance)")
        if not self.reject_rate_ok:
            out.append(
                f"reject rate of v{self.version} is {self.reject_rate:.2%} ({self.rejects} rejects of "
                f"{self.offsets_read} records read), over the limit {self.max_reject_rate:.2%} (max_reject_rate)")
        return out


def _reading(uri: str, fn, *args):
    """``fn(uri, *args)``, with a table that vanished meanwhile (a concurrent retire deleted its files
    between two reads) a SinkError that says so, not delta-rs's FileNotFoundError."""
    try:
        return fn(uri, *args)
    except KappaError:
        raise
    except Exception as e:  # delta-rs raises its own errors, and OSError for a missing file
        raise SinkError(f"cannot read the table {uri}: {str(e).splitlines()[0] if str(e) else type(e).__name__} "
                        f"(was it retired or deleted meanwhile? see kappa status)") from None


def _read_table(uri: str, columns: list[str] | None = None):
    """The table's rows; called only after its schema was read, so a table that is gone now was
    removed meanwhile (a concurrent retire) and reading it is refused, never an empty answer."""
    from orchestrator.core.tables import is_table, read_table

    if not is_table(uri):
        raise FileNotFoundError("its Delta log is gone")
    return read_table(uri, columns)


def _read(uri: str, columns: list[str] | None = None):
    return _reading(uri, _read_table, columns)


def _names(uri: str) -> list[str] | None:
    from orchestrator.core.tables import column_names

    return column_names(uri)


def _schema_names(uri: str) -> list[str] | None:
    return _reading(uri, _names)


def _count_rows(uri: str) -> int:
    from orchestrator.core.tables import count_rows

    return _reading(uri, count_rows)


def _differs(a, b):
    import pyarrow.compute as pc

    ne = pc.fill_null(pc.not_equal(a, b), False)
    return pc.or_(ne, pc.xor(pc.is_null(a), pc.is_null(b)))


def compare_tables(new, old, key_columns: list[str], top: int = TOP_CHANGES) -> dict[str, Any]:
    """Join two tables on the key and count what differs; see the module docstring.

    `top_changes` holds the values as pyarrow returns them; `Report.model_dump(mode="json")` makes them JSON.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = list(key_columns)
    common = [c for c in new.column_names if c in old.column_names and c not in keys
              and not c.startswith("source_") and not c.startswith("_")]
    raw = [c for c in common if c.endswith("_raw") and c[:-4] in common]
    derived = [c[:-4] for c in raw]
    compared = derived or common
    inputs = [c for c in common if c not in derived] if derived else []

    old_r = old.select(keys + common).rename_columns(keys + [f"{c}__old" for c in common])
    joined = new.select(keys + common).join(old_r, keys=keys, join_type="inner")
    n = joined.num_rows
    same_input = pa.array([True] * n, pa.bool_())
    for c in inputs:
        same_input = pc.and_(same_input, pc.invert(_differs(joined[c], joined[f"{c}__old"])))
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
    only_new = new.num_rows - n
    only_old = old.num_rows - n
    return {
        "compared_columns": compared, "input_columns": inputs, "rows_compared": n,
        "rows_changed": pc.sum(any_change).as_py() or 0,
        "rows_input_differs": (n - (pc.sum(same_input).as_py() or 0)) if inputs else 0,
        "keys_only_new": only_new, "keys_only_serving": only_old,
        "changed_by_column": by_column, "top_changes": top_changes,
    }


def _keys_lost_to_compaction(new, old, keys: list[str], rejects_uri: str) -> int:
    """Keys only in the serving table whose record in the new version's rejects is all the log holds
    of them now: a malformed latest record, its earlier valid value compacted away. Counted for a
    pipeline keyed by one column, matched against the rejected records' Kafka keys (UTF-8)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(keys) != 1 or "key" not in (_schema_names(rejects_uri) or []):
        return 0
    only_old = old.select(keys).join(new.select(keys), keys=keys, join_type="left anti")
    if only_old.num_rows == 0:
        return 0
    raw = _read(rejects_uri, ["key"]).column("key").drop_null()
    rejected = pa.array({b.decode("utf-8", "replace") for b in raw.to_pylist()}, pa.string())
    column = pc.cast(only_old.column(keys[0]), pa.string())
    return pc.sum(pc.is_in(column, value_set=rejected)).as_py() or 0


def _offsets_read(k: Kappa, pipeline: str, version: int) -> int:
    from orchestrator.observe.lag import checkpoint_next_offsets, log_offsets

    ckpt, _ = checkpoint_next_offsets(k.paths(pipeline, version).checkpoint)
    if not ckpt:
        return 0
    try:
        starts = {tp: lo for tp, (lo, _hi) in log_offsets(k, k.pipeline(pipeline).topics).items()}
    except Exception:
        starts = {}
    return sum(max(0, nxt - starts.get(tp, 0)) for tp, nxt in ckpt.items())


def validation_report(k: Kappa, pipeline: str, version: int, *, save: bool = True,
                      serving_version: int | None = _UNSET) -> Report:
    """Compare version N with the version the alias serves now; save the report beside N."""
    spec = k.pipeline(pipeline)
    reg = k.registry
    rec = reg.get_version(pipeline, version)
    if serving_version is _UNSET:
        alias = reg.get_alias(spec.alias)
        serving_version = alias.version if alias is not None and alias.pipeline == pipeline else None
    if serving_version == version:
        alias_prev = reg.get_alias(spec.alias)
        serving_version = alias_prev.previous_version if alias_prev is not None else None
    paths = k.paths(pipeline, version)
    new_cols = _schema_names(paths.table)
    if new_cols is None:
        raise SinkError(f"{pipeline} v{version} has no output table yet at {paths.table}: its job has not "
                        f"committed a micro-batch; wait until it is ready")
    keys_new = _count_rows(paths.table)
    rejects = _count_rows(paths.rejects)
    offsets_read = _offsets_read(k, pipeline, version)
    reject_rate = rejects / offsets_read if offsets_read else 0.0

    report = Report(
        pipeline=pipeline, version=version, serving_version=serving_version, alias=spec.alias,
        generated_at=time.time(), keys_new=keys_new, keys_serving=None, key_delta_ratio=None,
        key_count_tolerance=spec.key_count_tolerance, key_count_ok=None, offsets_read=offsets_read,
        rejects=rejects, reject_rate=reject_rate, max_reject_rate=spec.max_reject_rate,
        reject_rate_ok=reject_rate <= spec.max_reject_rate,
        rules_version=rec.rules_version)
    if serving_version is not None:
        old_paths = k.paths(pipeline, serving_version)
        old_rec = reg.get_version(pipeline, serving_version)
        report.serving_rules_version = old_rec.rules_version
        old_cols = _schema_names(old_paths.table)
        keys_old = _count_rows(old_paths.table) if old_cols is not None else 0
        report.keys_serving = keys_old
        delta = abs(keys_new - keys_old)
        report.key_delta_ratio = (delta / keys_old) if keys_old else (0.0 if delta == 0 else float("inf"))
        report.key_count_ok = report.key_delta_ratio <= spec.key_count_tolerance
        if old_cols is not None:
            keys = list(spec.key_columns)
            wanted = keys + [c for c in new_cols if c in old_cols and c not in keys
                             and not c.startswith("source_") and not c.startswith("_")]
            new_t = _read(paths.table, wanted)
            old_t = _read(old_paths.table, wanted)
            for name, value in compare_tables(new_t, old_t, list(spec.key_columns)).items():
                setattr(report, name, value)
            lost = _keys_lost_to_compaction(new_t, old_t, keys, paths.rejects)
            if lost:
                report.keys_lost_to_compaction = lost
                report.keys_only_serving -= lost
                kept = keys_old - lost
                delta = abs(keys_new - kept)
                report.key_delta_ratio = (delta / kept) if kept else (0.0 if delta == 0 else float("inf"))
                report.key_count_ok = report.key_delta_ratio <= spec.key_count_tolerance
    if save:
        report.path = str(paths.report_file)
        try:  # the version's folder exists since deploy; gone means a concurrent retire deleted it
            write_json_atomic(paths.report_file, report.model_dump(mode="json"), indent=None, make_parents=False)
        except FileNotFoundError:
            raise SinkError(f"cannot write the validation report of {pipeline} v{version} to {paths.report_file}: "
                            f"its folder is gone (was it retired meanwhile? see kappa status)") from None
    return report
