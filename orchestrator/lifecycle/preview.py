"""Rules preview: what a rules version would change in the served table, before any reprocess.

The standardize job keeps each raw input beside the value its rules derived (`title_raw` ->
`title`, `company_raw` -> `company`), so the served table already holds everything a new rules
version needs: the preview reads those columns of the table the serving alias points at (through
its pointer file, as readers do, `orchestrator.serving.resolve_alias`) with delta-rs, applies the
new rules with the job's own engine (`jobs.lib.rules.model.Rules.standardize_array`, the call the job
makes on every micro-batch) in pyarrow, and compares the result with the served values the way
the validation report compares two versions (`orchestrator.lifecycle.diff.compare_tables`):
rows that would change per field and the most frequent changes. No Spark, no broker, no
registry write: seconds, not a reprocess.

What it cannot show is what the log holds and the served table does not (rejects, records the
serving version has not read yet); the validation report of the rebuilt version shows those.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from orchestrator.core.exceptions import ConfigError, NotFoundError, SinkError
from orchestrator.context import Kappa
from orchestrator.core.pipelines import PipelineSpec
from orchestrator.core.tables import read_table
from orchestrator.lifecycle.diff import TOP_CHANGES, compare_tables

__all__ = ["RulesPreview", "preview_rules", "served_pointer"]


class RulesPreview(BaseModel):
    """What `rules_version` would change in the served table; the change fields read as the validation report's."""

    pipeline: str
    alias: str
    rules_version: str
    rules_file: str
    rules_hash: str
    serving_version: int
    serving_rules_version: str | None = None
    serving_rules_hash: str | None = None
    table: str
    delta_version: int
    published_at: float | None = None
    generated_at: float
    seconds: float
    compared_columns: list[str] = Field(default_factory=list)
    input_columns: list[str] = Field(default_factory=list)
    rows_compared: int = 0
    rows_changed: int = 0
    changed_by_column: dict[str, int] = Field(default_factory=dict)
    top_changes: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)

    @property
    def same_rules(self) -> bool:
        """The served version was built from the same rules content (comments aside)."""
        return self.serving_rules_hash == self.rules_hash


def served_pointer(k: Kappa, spec: PipelineSpec) -> dict[str, Any] | None:
    """The published pointer of the pipeline's alias; None when nothing is served yet.

    SinkError when the pointer file is damaged, ConfigError when it names another pipeline.
    """
    from orchestrator.serving import resolve_alias

    pipeline = spec.name
    try:
        pointer = resolve_alias(spec.alias, k.settings)
    except NotFoundError:
        return None
    if pointer["pipeline"] != pipeline:
        raise ConfigError(
            f"alias {spec.alias!r} of pipeline {pipeline!r} is published for pipeline {pointer['pipeline']!r} "
            f"(v{pointer['version']}); give each pipeline its own alias in {k.settings.pipelines_file}")
    return pointer


def _load(k: Kappa, spec: PipelineSpec, rules_version: str):
    """The validated rules file, found and checked as deploy finds and checks it."""
    from jobs.lib.rules.files import load_rules, rules_path

    if not spec.ruleset:
        raise ConfigError(f"pipeline {spec.name!r} (job {spec.job!r}) takes no rules: there is nothing to preview")
    return load_rules(rules_path(spec.ruleset, rules_version, k.settings.rules_location))


def _open(pointer: dict[str, Any], alias: str):
    from deltalake import DeltaTable

    try:
        return DeltaTable(pointer["table"])
    except Exception as e:  # TableNotFoundError and friends
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SinkError(
            f"alias {alias!r} points at {pointer['pipeline']} v{pointer['version']}, whose table {pointer['table']} "
            f"cannot be opened ({first}); see `kappa status {pointer['pipeline']}` or run `kappa reconcile`") from None


def preview_rules(k: Kappa, spec: PipelineSpec, rules_version: str, *, top: int = TOP_CHANGES) -> RulesPreview:
    """Apply `rules_version` to the raw columns of the table `pipeline`'s alias serves; count what changes.

    NotFoundError for an unknown pipeline or when nothing is served yet, RulesError for a rules
    version that is missing or does not validate (deploy's errors), ConfigError for a pipeline
    without rules, SinkError when the served table cannot be read or keeps no raw columns.
    """
    import pyarrow as pa

    t0 = time.perf_counter()
    pipeline = spec.name
    rules = _load(k, spec, rules_version)
    pointer = served_pointer(k, spec)
    if pointer is None:
        raise NotFoundError(
            f"pipeline {pipeline!r} serves nothing yet (alias {spec.alias!r} is not published), so there is no "
            f"table to preview rules {rules_version} on; deploy and promote a first version "
            f"(`kappa deploy {pipeline} --rules {rules_version} --wait`, then `kappa promote {pipeline}`)")
    dt = _open(pointer, spec.alias)
    names = {f.name for f in dt.schema().fields}
    keys = list(spec.key_columns)
    pairs = [(section, field) for section, field in rules.columns.items()
             if field in names and f"{field}_raw" in names]
    missing = [c for c in keys if c not in names]
    if not pairs or missing:
        wanted = ", ".join(f"{f}_raw and {f}" for f in rules.columns.values())
        raise SinkError(
            f"the table {pointer['table']} that alias {spec.alias!r} serves ({pipeline} v{pointer['version']}) "
            + (f"lacks the key column(s) {', '.join(missing)}" if missing else f"keeps no raw column beside its "
               f"derived one ({wanted})")
            + "; a rules preview needs the raw values the rules apply to")
    columns = keys + [c for _, f in pairs for c in (f"{f}_raw", f)]
    try:
        served = read_table(dt, columns)
    except Exception as e:  # a data file gone (vacuumed, retired meanwhile)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SinkError(f"cannot read the served table {pointer['table']}: {first}; see "
                        f"`kappa status {pipeline}`") from None
    derived = {f: rules.standardize_array(section, served[f"{f}_raw"]) for section, f in pairs}
    proposed = pa.table({c: derived[c] if c in derived else served[c] for c in columns})
    changes = compare_tables(proposed, served, keys, top=top)

    serving_rules_version = serving_rules_hash = None
    try:
        rec = k.registry.get_version(pipeline, int(pointer["version"]))
        serving_rules_version, serving_rules_hash = rec.rules_version, rec.rules_hash
    except NotFoundError:
        pass  # a pointer the registry no longer knows: `kappa reconcile` repairs it; the preview stands
    return RulesPreview(
        pipeline=pipeline, alias=spec.alias, rules_version=rules.version, rules_file=str(rules.path),
        rules_hash=rules.content_hash, serving_version=int(pointer["version"]),
        serving_rules_version=serving_rules_version, serving_rules_hash=serving_rules_hash,
        table=pointer["table"], delta_version=dt.version(), published_at=pointer.get("published_at"),
        generated_at=time.time(), seconds=time.perf_counter() - t0,
        **{name: changes[name] for name in ("compared_columns", "input_columns", "rows_compared", "rows_changed",
                                            "changed_by_column", "top_changes")})
