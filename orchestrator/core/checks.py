"""A pipeline's checks: named SQL the team writes, with limits, run before every promote.

Declared in the pipelines file, one table per check:

    [[pipelines.standardize.checks]]
    name = "title_null_rate"
    sql = "SELECT avg(CASE WHEN title IS NULL THEN 1.0 ELSE 0 END) FROM candidate"
    max = 0.01
    watch = true            # also re-run on the live table while the promoted version is watched

    [[pipelines.standardize.checks]]
    name = "titles_changed"
    sql = "SELECT count(*) * 1.0 / (SELECT count(*) FROM candidate) FROM diff WHERE column_name = 'title'"
    max = 0.2

The SQL (DuckDB's dialect) returns one number; the check passes when it is within `min`/`max`. It
sees these tables: `candidate` (the version to promote), `serving` (the version the alias serves;
empty on a first promote), `candidate_rejects`, `serving_rejects` (their rejected records), and
`diff` (each value the new logic changed, compared at the same input: the key columns,
`column_name`, `old`, `new`; `orchestrator.lifecycle.diff`). The validation report, `promote
--dry-run` and every promote run them (`orchestrator.lifecycle.report`); kappa's own checks
(`key_count`, `reject_rate`, `schema`) are results of the same kind, so their names are reserved.

A check that does not parse, or names a table or column that does not exist, is refused with one
line by `validate_checks` (at deploy and by `kappa rules check --pipeline P`).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from orchestrator.core.exceptions import ConfigError
from orchestrator.core.names import validate_name

__all__ = ["BUILTIN", "TABLES", "CheckSpec", "CheckResult", "run_checks", "validate_checks", "result"]

#: kappa's own checks (and the promote's other preconditions): not a team check's name.
BUILTIN = ("ready", "report", "key_count", "reject_rate", "schema")
#: The tables a check's SQL reads.
TABLES = ("candidate", "serving", "candidate_rejects", "serving_rejects", "diff")


class CheckSpec(BaseModel):
    """One check as declared: a name, a SQL query returning one number, its limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    sql: str
    min: float | None = None
    max: float | None = None
    watch: bool = False
    description: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        try:
            validate_name(v, field="check name")
        except ConfigError as e:
            raise ValueError(str(e)) from None
        if v in BUILTIN:
            raise ValueError(f"{v!r} is the name of one of kappa's own checks ({', '.join(BUILTIN)}); pick another")
        return v

    @field_validator("sql")
    @classmethod
    def _sql(cls, v: str) -> str:
        if not v.strip():
            raise ValueError('is empty; write a query that returns one number, e.g. "SELECT count(*) FROM candidate"')
        return v

    @model_validator(mode="after")
    def _limits(self) -> CheckSpec:
        if self.min is None and self.max is None:
            raise ValueError(f"check {self.name!r} has no limit; set min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"check {self.name!r} has min {self.min} over max {self.max}")
        return self

    def limits(self) -> str:
        parts = ([] if self.min is None else [f"min {self.min:g}"]) + ([] if self.max is None else [f"max {self.max:g}"])
        return ", ".join(parts)


class CheckResult(BaseModel):
    """One check's outcome: its value against its limits (`detail` says both)."""

    model_config = ConfigDict(frozen=True)

    name: str
    ok: bool
    detail: str
    value: float | None = None
    limit: str | None = None
    builtin: bool = False
    watch: bool = False


def result(name: str, ok: bool, detail: str, *, value: float | None = None, limit: str | None = None,
           builtin: bool = True) -> CheckResult:
    """One of kappa's own checks as a result of the same kind."""
    return CheckResult(name=name, ok=ok, detail=detail, value=value, limit=limit, builtin=builtin)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _connect(tables: dict[str, Any]):
    import duckdb

    con = duckdb.connect()
    for name in TABLES:
        if name in tables:
            con.register(name, tables[name])
    return con


def _value(row: Any) -> float | None:
    if row is None or row[0] is None:
        return None
    v = row[0]
    if isinstance(v, bool):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        raise TypeError(f"returned {v!r}, not a number") from None


def run_checks(checks: list[CheckSpec] | tuple[CheckSpec, ...], tables: dict[str, Any]) -> list[CheckResult]:
    """Run each check over `tables` (name -> pyarrow Table, names from TABLES); never raises."""
    if not checks:
        return []
    con = _connect(tables)
    out = []
    try:
        for c in checks:
            try:
                value = _value(con.execute(c.sql).fetchone())
            except Exception as e:  # duckdb's errors, and a value that is not a number
                out.append(CheckResult(name=c.name, ok=False, limit=c.limits(), watch=c.watch,
                                       detail=f"did not run: {_first_line(e)}"))
                continue
            if value is None or math.isnan(value):
                out.append(CheckResult(name=c.name, ok=False, limit=c.limits(), watch=c.watch,
                                       detail=f"returned no value (NULL), limit {c.limits()}"))
                continue
            ok = (c.min is None or value >= c.min) and (c.max is None or value <= c.max)
            out.append(CheckResult(name=c.name, ok=ok, value=value, limit=c.limits(), watch=c.watch,
                                   detail=f"{value:.6g} {'within' if ok else 'outside'} its limit ({c.limits()})"))
    finally:
        con.close()
    return out


def validate_checks(pipeline: str, checks: list[CheckSpec] | tuple[CheckSpec, ...], schemas: dict[str, Any],
                    *, where: str = "") -> None:
    """Bind each check's SQL against empty tables of `schemas` (name -> pyarrow Schema); ConfigError
    with one line naming the pipeline, the check and what is wrong (a parse error, an unknown table or
    column). `where` says what the schemas are (for the error)."""
    if not checks:
        return
    con = _connect({name: schema.empty_table() for name, schema in schemas.items()})
    try:
        for c in checks:
            try:
                con.execute(f"EXPLAIN {c.sql}")
            except Exception as e:
                raise ConfigError(f"pipeline {pipeline!r}, check {c.name!r}: {_first_line(e)}{where}; fix its sql "
                                  f"in the pipelines file (tables: {', '.join(TABLES)})") from None
    finally:
        con.close()
