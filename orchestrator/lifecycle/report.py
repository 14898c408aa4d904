"""The validation report of a version against the version its alias serves now.

What an operator wants to see before a flip: how many keys each table holds (a rebuild from
the same log should hold the same keys, within the pipeline's tolerance), how many input
records the new version rejected, what the new derivation changed (compared at the same input,
`orchestrator.lifecycle.diff`: per column, the most frequent changes old -> new with their
counts), which columns were added, removed or retyped, and the outcome of every check: kappa's
own (`key_count`, `reject_rate`, `schema`) and the pipeline's (`orchestrator.core.checks`).

Each table is read once, at one Delta version (`table_versions`): the counts, the diff and the
checks all see the same snapshot. Input skew is counted apart and never as a change: rows in both
tables derived from different Kafka records (`rows_input_differs`), and keys only one version
holds on a partition the two have read to different offsets (`keys_only_*_skewed`, from the
versions' checkpoints); those keys are left out of the key-count check.

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

from orchestrator.core.checks import CheckResult, result, run_checks
from orchestrator.core.exceptions import ConfigError, KappaError, SinkError
from orchestrator.core.files import write_json_atomic
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.context import Kappa, VersionRef
from orchestrator.lifecycle.diff import POSITION, compare_tables, diff_rows, schema_changes

__all__ = ["Report", "validation_report", "check_tables", "check_pipeline_checks"]

_UNSET: Any = object()


class Report(BaseModel):
    """The validation report of one version; `checks` (and `ok`, `problems`) are what promote checks."""

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
    #: The Delta version each table was read at ("candidate", "serving").
    table_versions: dict[str, int] = Field(default_factory=dict)
    compared_columns: list[str] = Field(default_factory=list)
    input_columns: list[str] = Field(default_factory=list)
    #: True: rows were compared only when both come from the same Kafka record (source position).
    aligned: bool = False
    rows_compared: int = 0
    rows_same_input: int = 0
    rows_changed: int = 0
    rows_input_differs: int = 0
    keys_only_new: int = 0
    keys_only_serving: int = 0
    #: Of the keys only one table holds, those on a partition the versions have read to different
    #: offsets (input skew: left out of the key-count check).
    keys_only_new_skewed: int = 0
    keys_only_serving_skewed: int = 0
    #: Keys the serving version has and this one cannot: their latest record in the log is malformed
    #: (in this version's rejects) and the cleaner removed their earlier valid value from the log.
    #: Not a change of the new logic; left out of keys_only_serving and of the key-count check.
    keys_lost_to_compaction: int = 0
    #: The key counts the key-count check compares: each table's keys less those left out above
    #: (input skew, and for the serving table the keys lost to compaction). None: nothing served.
    keys_new_compared: int | None = None
    keys_serving_compared: int | None = None
    changed_by_column: dict[str, int] = Field(default_factory=dict)
    top_changes: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    columns_added: list[str] = Field(default_factory=list)
    columns_removed: list[str] = Field(default_factory=list)
    columns_retyped: dict[str, list[str]] = Field(default_factory=dict)
    checks: list[CheckResult] = Field(default_factory=list)
    path: str | None = None

    @field_serializer("key_delta_ratio", when_used="json")
    def _infinite_ratio_as_text(self, ratio: float | None) -> float | str | None:
        """Strict JSON has no infinity: a serving table with no keys gives the ratio "inf"."""
        return "inf" if ratio is not None and math.isinf(ratio) else ratio

    @computed_field
    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @computed_field
    @property
    def problems(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if not c.ok]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def keys_compared(self) -> str | None:
        """The key counts as compared, with what was left out, in one phrase: '4,846 keys in v2, 4,875 in v1;
        compared 4,846 with 4,846, leaving out 29 only in v1 on partitions read to different offsets (input skew)'.
        None: nothing served to compare with."""
        if self.serving_version is None:
            return None
        n, old = self.version, self.serving_version
        text = f"{self.keys_new:,} keys in v{n}, {self.keys_serving or 0:,} in v{old}"
        skewed = ((self.keys_only_new_skewed, n), (self.keys_only_serving_skewed, old))
        left_out = [f"{c:,} only in v{v}" for c, v in skewed if c]
        why = [f"{' and '.join(left_out)} on partitions read to different offsets (input skew)"] if left_out else []
        if self.keys_lost_to_compaction:
            why.append(f"{self.keys_lost_to_compaction:,} lost to compaction")
        if not why:
            return text + "; all compared"
        compared_new = self.keys_new if self.keys_new_compared is None else self.keys_new_compared
        compared_old = (self.keys_serving or 0) if self.keys_serving_compared is None else self.keys_serving_compared
        return f"{text}; compared {compared_new:,} with {compared_old:,}, leaving out {', '.join(why)}"

    @property
    def schema_changed(self) -> bool:
        return bool(self.columns_removed or self.columns_retyped)


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


def _snapshot(uri: str):
    """(rows, Delta version) of the table at `uri`, read once; None if it has no table yet."""
    from orchestrator.core.tables import snapshot

    return _reading(uri, snapshot)


def _empty_like(table):
    return table.schema.empty_table()


def _keys_lost_to_compaction(new, old, keys: list[str], rejects) -> int:
    """Keys only in the serving table whose record in the new version's rejects is all the log holds
    of them now: a malformed latest record, its earlier valid value compacted away. Counted for a
    pipeline keyed by one column, matched against the rejected records' Kafka keys (UTF-8)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(keys) != 1 or "key" not in rejects.column_names:
        return 0
    only_old = old.select(keys).join(new.select(keys), keys=keys, join_type="left anti")
    if only_old.num_rows == 0:
        return 0
    raw = rejects.column("key").drop_null()
    rejected = pa.array({b.decode("utf-8", "replace") for b in raw.to_pylist()}, pa.string())
    column = pc.cast(only_old.column(keys[0]), pa.string())
    return pc.sum(pc.is_in(column, value_set=rejected)).as_py() or 0


def _skewed(mine, other, keys: list[str], mine_next: dict[tuple[str, int], int] | None,
            other_next: dict[tuple[str, int], int] | None, topics: tuple[str, ...]) -> int:
    """Keys only `mine` holds, on a partition the two versions have read to different offsets: input
    skew (a record, or a tombstone, one version has read and the other not yet), not the new logic.
    Known for a pipeline on one topic whose tables carry the source position; 0 otherwise."""
    if len(topics) != 1 or not all(p in mine.column_names for p in POSITION):
        return 0
    only = mine.select(keys + [POSITION[0]]).join(other.select(keys), keys=keys, join_type="left anti")
    if only.num_rows == 0:
        return 0
    mine_next, other_next = mine_next or {}, other_next or {}
    return sum(1 for p in only.column(POSITION[0]).to_pylist()
               if p is None or mine_next.get((topics[0], int(p))) != other_next.get((topics[0], int(p))))


def _next_offsets(v: VersionRef) -> dict[tuple[str, int], int] | None:
    from orchestrator.observe.lag import checkpoint_next_offsets

    return checkpoint_next_offsets(v.paths.checkpoint)[0]


def offsets_read(v: VersionRef, ckpt: Any = _UNSET) -> int:
    """Records the version has read, by offsets; `ckpt`: its checkpoint's next offsets, if read already."""
    from orchestrator.observe.lag import log_offsets

    if ckpt is _UNSET:
        ckpt = _next_offsets(v)
    if not ckpt:
        return 0
    try:
        starts = {tp: lo for tp, (lo, _hi) in log_offsets(v.k, v.spec.topics).items()}
    except Exception:
        starts = {}
    return sum(max(0, nxt - starts.get(tp, 0)) for tp, nxt in ckpt.items())


def check_tables(v: VersionRef, other: VersionRef | None, *,
                 checks: Any = ()) -> tuple[dict[str, Any], dict[str, int]]:
    """The tables a check reads (`orchestrator.core.checks.TABLES`), with `v` as the candidate and
    `other` as the serving one, each read once; and the Delta version each was read at. The `diff`
    table (a join of the two) is made only when one of `checks` reads it."""
    spec, paths, pipeline, version = v.spec, v.paths, v.pipeline, v.version
    snap = _snapshot(paths.table)
    if snap is None:
        raise SinkError(f"{pipeline} v{version} has no output table yet at {paths.table}: its job has not "
                        f"committed a micro-batch; wait until it is ready")
    new, versions_read = snap[0], {"candidate": snap[1]}
    rejects_snap = _snapshot(paths.rejects)
    tables = {"candidate": new, "candidate_rejects": rejects_snap[0] if rejects_snap else None}
    old = old_rejects = None
    if other is not None:
        old_paths = other.paths
        old_snap = _snapshot(old_paths.table)
        if old_snap is not None:
            old, versions_read["serving"] = old_snap
        old_rejects_snap = _snapshot(old_paths.rejects)
        old_rejects = old_rejects_snap[0] if old_rejects_snap else None
    tables["serving"] = old if old is not None else _empty_like(new)
    if tables["candidate_rejects"] is None:
        tables["candidate_rejects"] = old_rejects if old_rejects is not None else _empty_rejects()
    tables["serving_rejects"] = old_rejects if old_rejects is not None else _empty_like(tables["candidate_rejects"])
    if any("diff" in c.sql.lower() for c in checks):
        tables["diff"] = diff_rows(new, old if old is not None else new, list(spec.key_columns))
    return tables, versions_read


def _empty_rejects():
    import pyarrow as pa

    return pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
                      ("offset", pa.int64()), ("error", pa.string()), ("batch_id", pa.int64())]).empty_table()


def _builtin_checks(report: Report) -> list[CheckResult]:
    out = []
    if report.serving_version is None:
        out.append(result("key_count", True, f"first promote of {report.pipeline}: no serving version to compare "
                                             f"the key count ({report.keys_new}) with", value=report.keys_new))
    else:
        ratio = report.key_delta_ratio
        detail = (f"{report.keys_compared}: difference {ratio:.2%}, "
                  + (f"tolerance {report.key_count_tolerance:.2%}" if report.key_count_ok else
                     f"over the tolerance {report.key_count_tolerance:.2%} (key_count_tolerance)"))
        out.append(result("key_count", bool(report.key_count_ok), detail, value=ratio,
                          limit=f"max {report.key_count_tolerance:g}"))
    out.append(result("reject_rate", report.reject_rate_ok,
                      f"{report.rejects} rejects of {report.offsets_read} records read ({report.reject_rate:.2%}, "
                      f"limit {report.max_reject_rate:.2%})", value=report.reject_rate,
                      limit=f"max {report.max_reject_rate:g}"))
    if report.serving_version is not None:
        removed, retyped = report.columns_removed, report.columns_retyped
        if removed or retyped:
            what = "; ".join(([f"columns removed: {', '.join(removed)}"] if removed else [])
                             + (["columns retyped: " + ", ".join(f"{c} {a} -> {b}" for c, (a, b) in retyped.items())]
                                if retyped else []))
            out.append(result("schema", False, f"{what} (v{report.serving_version} -> v{report.version}); readers of "
                                               f"the alias may break: promote with --allow-schema-change if meant"))
        else:
            added = f" (added: {', '.join(report.columns_added)})" if report.columns_added else ""
            out.append(result("schema", True, f"no column removed or retyped{added}"))
    return out


def validation_report(v: VersionRef, *, save: bool = True, serving: VersionRef | None = _UNSET) -> Report:
    """Compare the version with `serving` (default: the version the alias serves now), run the checks;
    save the report beside the version."""
    spec, reg, rec, pipeline, version, paths = v.spec, v.registry, v.record, v.pipeline, v.version, v.paths
    if serving is _UNSET or (serving is not None and serving.version == version):
        alias = reg.get_alias(spec.alias)
        if serving is _UNSET:
            n = alias.version if alias is not None and alias.pipeline == pipeline else None
        else:
            n = version
        if n == version:      # it serves already: compare it with the version it replaced
            n = alias.previous_version if alias is not None else None
        serving = None if n is None else v.sibling(n)
    serving_version = None if serving is None else serving.version
    tables, table_versions = check_tables(v, serving, checks=spec.checks)
    new, rejects = tables["candidate"], tables["candidate_rejects"]
    new_next = _next_offsets(v)
    n_read = offsets_read(v, new_next)
    reject_rate = rejects.num_rows / n_read if n_read else 0.0
    report = Report(
        pipeline=pipeline, version=version, serving_version=serving_version, alias=spec.alias,
        generated_at=time.time(), keys_new=new.num_rows, keys_serving=None, key_delta_ratio=None,
        key_count_tolerance=spec.key_count_tolerance, key_count_ok=None, offsets_read=n_read,
        rejects=rejects.num_rows, reject_rate=reject_rate, max_reject_rate=spec.max_reject_rate,
        reject_rate_ok=reject_rate <= spec.max_reject_rate, rules_version=rec.rules_version,
        table_versions=table_versions)
    if serving is not None:
        report.serving_rules_version = serving.record.rules_version
        old = tables["serving"]
        keys = list(spec.key_columns)
        report.keys_serving = old.num_rows
        for name, value in compare_tables(new, old, keys).items():
            setattr(report, name, value)
        for name, value in schema_changes(new.schema, old.schema).items():
            setattr(report, name, value)
        lost = _keys_lost_to_compaction(new, old, keys, rejects)
        report.keys_lost_to_compaction = lost
        report.keys_only_serving -= lost
        old_next = _next_offsets(serving)
        report.keys_only_serving_skewed = _skewed(old, new, keys, old_next, new_next, spec.topics)
        report.keys_only_new_skewed = _skewed(new, old, keys, new_next, old_next, spec.topics)
        kept_old = old.num_rows - lost - report.keys_only_serving_skewed
        kept_new = new.num_rows - report.keys_only_new_skewed
        report.keys_new_compared, report.keys_serving_compared = kept_new, kept_old
        delta = abs(kept_new - kept_old)
        report.key_delta_ratio = (delta / kept_old) if kept_old else (0.0 if delta == 0 else float("inf"))
        report.key_count_ok = report.key_delta_ratio <= spec.key_count_tolerance
    report.checks = _builtin_checks(report) + run_checks(spec.checks, tables)
    if save:
        report.path = str(paths.report_file)
        try:  # the version's folder exists since deploy; gone means a concurrent retire deleted it
            write_json_atomic(paths.report_file, report.model_dump(mode="json"), indent=None, make_parents=False)
        except FileNotFoundError:
            raise SinkError(f"cannot write the validation report of {pipeline} v{version} to {paths.report_file}: "
                            f"its folder is gone (was it retired meanwhile? see kappa status)") from None
    return report


def check_pipeline_checks(k: Kappa, spec: PipelineSpec) -> str:
    """Refuse (ConfigError, one line) a check of `pipeline` that does not parse or names an unknown table
    or column; what it was checked against. The columns are those of the newest version's table that
    exists (the one the alias serves, else the newest): a version about to be deployed is expected to
    write the same columns. Before any table exists, the SQL is parsed only."""
    import pyarrow as pa

    from orchestrator.core.checks import validate_checks
    from orchestrator.core.tables import arrow_schema

    pipeline = spec.name
    if not spec.checks:
        return "no checks declared"
    alias = k.registry.get_alias(spec.alias)
    live = {v.version: v for v in k.versions(spec) if v.record.state != "retired"}
    order = sorted(live, reverse=True)
    if alias is not None and alias.pipeline == pipeline and alias.version in live:
        order = [alias.version] + [n for n in order if n != alias.version]
    for n in order:
        paths = live[n].paths
        table = arrow_schema(paths.table)
        if table is None:
            continue
        rejects = arrow_schema(paths.rejects) or _empty_rejects().schema
        diff = pa.schema([table.field(c) for c in spec.key_columns if c in table.names]
                         + [pa.field(c, pa.string()) for c in ("column_name", "old", "new")])
        schemas = {"candidate": table, "serving": table, "candidate_rejects": rejects, "serving_rejects": rejects,
                   "diff": diff}
        validate_checks(pipeline, spec.checks, schemas, where=f" (checked against the columns of v{n}'s table)")
        return f"{len(spec.checks)} checks bind against the columns of v{n}'s table"
    import duckdb

    for c in spec.checks:
        try:
            duckdb.extract_statements(c.sql)
        except Exception as e:
            line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"pipeline {pipeline!r}, check {c.name!r}: {line}; fix its sql in the pipelines "
                              f"file") from None
    return f"{len(spec.checks)} checks parse (no table yet to check their columns against)"
