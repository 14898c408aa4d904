"""Pipelines: the named derivations kappa knows, declared in `deploy/pipelines.toml`.

A pipeline names its job (a function of the job contract, `jobs.lib.contract.api`), its source topics, its output key, its rules
set (if the job takes rules), the serving alias readers use, and the numbers the control plane
decides with (catch-up threshold and samples, standby grace period, retention, promote limits).

    [pipelines.standardize]
    job = "standardize"             # kappa's own job; a team's: "team_jobs.profiles:transform" (job_path)
    topics = ["member_profiles"]
    key = "member_id"               # or ["member_id", "window_start"] for a composite key
    ruleset = "titles"              # jobs/rules/titles/*.toml; omit for jobs without rules
    alias = "member_profiles_std"
    catchup_threshold = 0           # records
    catchup_seconds = 60            # and the oldest record not yet processed at most this old
    catchup_samples = 3
    grace_period_seconds = 300
    stop_timeout_seconds = 60       # a requested stop: the micro-batch in flight may take this long
    keep_versions = 3
    key_count_tolerance = 0.01
    max_reject_rate = 0.01
    max_records_per_batch = 100000
    max_restarts = 5                # supervision: a dead job is restarted at most this often ...
    restart_window_seconds = 600    # ... within this window, then its version is failed
    restart_backoff_seconds = 10    # wait before the 2nd restart in the window, doubling after
    restart_backoff_max_seconds = 120
    description = "..."             # optional
    auto_rollback = true            # watch a promoted version over its grace period, roll back if it degrades
    watch_max_lag_seconds = 60      # ... when its lag in seconds stays over this for watch_lag_samples samples
    watch_lag_samples = 3
    watch_on_rollback = "stop"      # the degraded version after an automatic rollback: "stop" or "keep" (running)
    backfill_share = 1.0            # a backfill's share of the machine, (0, 1]: its job's CPU weight (nice value)
    backfill_adaptive = true        # ... lowered while the serving version lags over the bound, raised after
    backfill_lag_bound_seconds = 60 # ... that bound (default: watch_max_lag_seconds, else catchup_seconds)
    backfill_interval_seconds = 5   # ... at most one change of share per this many seconds
    [[pipelines.standardize.checks]]  # optional, any number: SQL the promote checks (orchestrator.core.checks)
    name = "title_null_rate"
    sql = "SELECT avg(CASE WHEN title IS NULL THEN 1.0 ELSE 0 END) FROM candidate"
    max = 0.01
    watch = true                    # also re-run on the live table during the watch
    [pipelines.standardize.options] # optional: job-specific options, passed as --extra JSON

Loading validates every field and refuses the whole file on the first bad pipeline, with an
error naming the file, the pipeline and the field. It does not look at the code: the rules directory
is checked by `check_ruleset_exists` here, the job by `orchestrator.jobctl.jobcheck.check_job_exists`
(both in its `check_pipeline_code`), which `deploy` runs before allocating a version; the job's
check lives above the jobs, since nothing here imports them. A pipeline's ``job`` is read by
`orchestrator.core.jobref`.

Without a path, `load_pipelines` reads the default pipelines file: the checkout's
`deploy/pipelines.toml`, or the copy a regular install ships.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, computed_field,
                      field_validator)

from orchestrator.core.checks import CheckSpec
from orchestrator.core.exceptions import ConfigError
from orchestrator.core.names import (validate_alias_name, validate_job_name, validate_name,
                                     validate_pipeline_name, validate_topic_name)
from orchestrator.core.resources import checkout_root, default_pipelines_file
from orchestrator.core.shares import check_share

__all__ = ["PipelineSpec", "check_ruleset_exists", "jobs_directory", "load_pipelines", "rules_directory"]

_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]
PositiveInt = Annotated[int, Field(strict=True, ge=1)]
Fraction = Annotated[float, Field(strict=True, ge=0.0, le=1.0)]


class PipelineSpec(BaseModel):
    """One pipeline as declared. Frozen: a deploy records the values it used."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    job: str
    topics: tuple[str, ...]
    key: str
    alias: str
    ruleset: str | None = None
    catchup_threshold: NonNegativeInt = 0
    #: Catch-up in time: ready also needs the oldest record the version has not processed to be at
    #: most this many seconds old (its lag in seconds, from Kafka record timestamps). Both limits
    #: hold at once, records and seconds (`orchestrator.lifecycle.await_ready`). The default, a
    #: minute, is a few live micro-batches of a job that keeps up on a small machine.
    catchup_seconds: Annotated[float, Field(strict=True, gt=0.0)] = 60.0
    catchup_samples: PositiveInt = 3
    grace_period_seconds: Annotated[float, Field(strict=True, ge=0.0)] = 300.0
    #: The bound of a requested stop (`orchestrator.jobctl.stop`): the job finishes the micro-batch in
    #: flight and starts no new one; one still running this long after the request is stopped at once
    #: (SIGTERM; SIGKILL if need be), recorded `stopped` (killed at the bound, audited), its batch
    #: replayed from the checkpoint at the next start. A minute: a few live batches on a small machine.
    stop_timeout_seconds: Annotated[float, Field(strict=True, gt=0.0)] = 60.0
    keep_versions: PositiveInt = 3
    key_count_tolerance: Fraction = 0.01
    max_reject_rate: Fraction = 0.01
    max_records_per_batch: PositiveInt = 100_000
    #: Supervision (`orchestrator.lifecycle.supervise`): a version whose job died is restarted from
    #: its checkpoint at most `max_restarts` times within `restart_window_seconds` (0: never), the
    #: first at once, each later one `restart_backoff_seconds` doubling (at most the max) after the
    #: one before; one more death in the window fails the version and the monitor raises.
    max_restarts: NonNegativeInt = 5
    restart_window_seconds: Annotated[float, Field(strict=True, gt=0.0)] = 600.0
    restart_backoff_seconds: Annotated[float, Field(strict=True, ge=0.0)] = 10.0
    restart_backoff_max_seconds: Annotated[float, Field(strict=True, ge=0.0)] = 120.0
    description: str = ""
    options: dict[str, Any] = {}
    #: The team's checks (`orchestrator.core.checks`): run in the report and before every promote.
    checks: tuple[CheckSpec, ...] = ()
    #: The watch (`orchestrator.lifecycle.watch`): after a promote, while the previous version is
    #: standby (its grace period), roll back by itself when the promoted version's job is given up,
    #: its lag in seconds stays over `watch_max_lag_seconds` (default: `catchup_seconds`) for
    #: `watch_lag_samples` samples, its reject rate passes `max_reject_rate`, or a check with
    #: `watch = true` fails on its live table. Off unless set: the team chooses it per pipeline.
    auto_rollback: bool = False
    watch_max_lag_seconds: Annotated[float, Field(strict=True, gt=0.0)] | None = None
    watch_lag_samples: PositiveInt = 3
    watch_on_rollback: Literal["stop", "keep"] = "stop"
    #: A backfill that yields (`orchestrator.lifecycle.throttle`): the share of the machine a version
    #: that is not serving yet gets (`orchestrator.core.shares`: its job's nice value), and, with
    #: `backfill_adaptive`, lowered while the serving version's lag in seconds is over
    #: `backfill_lag_bound_seconds` (default: the watch's bound, `watch_lag_limit`) and raised back
    #: up to `backfill_share` once it is under half of it, at most once per `backfill_interval_seconds`.
    backfill_share: float = 1.0
    backfill_adaptive: Annotated[bool, Field(strict=True)] = True
    backfill_lag_bound_seconds: Annotated[float, Field(strict=True, gt=0.0)] | None = None
    backfill_interval_seconds: Annotated[float, Field(strict=True, gt=0.0)] = 5.0

    @field_validator("backfill_share", mode="before")
    @classmethod
    def _backfill_share(cls, v: Any) -> float:
        return check_share(v, what="the backfill's share")

    @property
    def backfill_lag_bound(self) -> float:
        """The serving version's lag in seconds a backfill yields to: `backfill_lag_bound_seconds`, else
        the watch's bound (`watch_lag_limit`)."""
        return self.backfill_lag_bound_seconds if self.backfill_lag_bound_seconds is not None \
            else self.watch_lag_limit

    @field_validator("checks")
    @classmethod
    def _checks(cls, v: tuple[CheckSpec, ...]) -> tuple[CheckSpec, ...]:
        names = [c.name for c in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"declares check {', '.join(map(repr, dupes))} more than once; names must be unique")
        return v

    @property
    def watch_lag_limit(self) -> float:
        """The lag in seconds the watch allows: `watch_max_lag_seconds`, else `catchup_seconds`."""
        return self.watch_max_lag_seconds if self.watch_max_lag_seconds is not None else self.catchup_seconds

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _as_value_error(validate_pipeline_name, v)

    @field_validator("job")
    @classmethod
    def _job(cls, v: str) -> str:
        return _as_value_error(validate_job_name, v)

    @field_validator("alias")
    @classmethod
    def _alias(cls, v: str) -> str:
        return _as_value_error(validate_alias_name, v)

    @field_validator("ruleset")
    @classmethod
    def _ruleset(cls, v: str | None) -> str | None:
        return None if v is None else _as_value_error(lambda x: validate_name(x, field="ruleset name"), v)

    @field_validator("topics", mode="before")
    @classmethod
    def _topics_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError(f'must be a list of topic names, e.g. ["{v}"]')
        return v

    @field_validator("topics")
    @classmethod
    def _topics(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("must name at least one topic")
        for t in v:
            _as_value_error(validate_topic_name, t)
        dupes = sorted({t for t in v if v.count(t) > 1})
        if dupes:
            raise ValueError(f"lists {', '.join(repr(d) for d in dupes)} more than once")
        return v

    @field_validator("key", mode="before")
    @classmethod
    def _key(cls, v: Any) -> Any:
        columns = v if isinstance(v, (list, tuple)) else [v]
        if not columns or not all(isinstance(c, str) for c in columns):
            raise ValueError('must be a column name or a list of column names, e.g. "member_id"')
        for c in columns:
            if _COLUMN.fullmatch(c) is None:
                raise ValueError(f"column {c!r} is not a valid column name (letters, digits, underscores, "
                                 f"not starting with a digit)")
        if len(set(columns)) != len(columns):
            raise ValueError("lists a column more than once")
        return ",".join(columns)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def key_columns(self) -> tuple[str, ...]:
        """The key as columns; part of `model_dump` so that `kappa pipelines --json` shows it."""
        return tuple(self.key.split(","))

    @property
    def uses_rules(self) -> bool:
        return self.ruleset is not None


def _as_value_error(check, value):
    """Run a names check inside a pydantic validator (pydantic reports ValueError per field)."""
    try:
        return check(value)
    except ConfigError as e:
        raise ValueError(str(e)) from None


def jobs_directory() -> Path:
    """Where kappa's own jobs (`jobs/<job>.py`) live, found without importing the package."""
    spec = importlib.util.find_spec("jobs")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return checkout_root() / "jobs"


def rules_directory() -> Path:
    return jobs_directory() / "rules"


def check_ruleset_exists(spec: PipelineSpec, *, rules_dir: Path | None = None) -> Path | None:
    """The ruleset's directory (holding at least one rules file), None for a job without rules."""
    if spec.ruleset is None:
        return None
    base = Path(rules_dir) if rules_dir is not None else rules_directory()
    folder = base / spec.ruleset
    if folder.is_dir() and any(folder.glob("*.toml")):
        return folder
    known = sorted(p.name for p in base.iterdir() if p.is_dir() and any(p.glob("*.toml"))) if base.is_dir() else []
    raise ConfigError(
        f"pipeline {spec.name!r}, field 'ruleset': unknown ruleset {spec.ruleset!r}: no rules files "
        f"(*.toml) in {folder} (rulesets found: {', '.join(known) or 'none'}); add "
        f"{folder / 'v1.toml'} or fix 'ruleset' in the pipelines file (or rules_location)")


#: Fields an older kappa took, and what to do with them now.
_REPLACED = {
    "catchup_max_lag_seconds": "renamed catchup_seconds: rename it (readiness now always needs both "
                               "catchup_threshold and catchup_seconds)",
    "catchup_rule": "removed: a version is caught up when within both catchup_threshold and catchup_seconds; "
                    "delete the line (raise catchup_threshold or catchup_seconds to loosen one of them)",
}


def _field_error(path: Path, pipeline: str, err: dict[str, Any]) -> str:
    loc = [str(p) for p in err["loc"]]
    field = loc[0] if loc else "?"
    where = f"pipelines file {path}: pipeline {pipeline!r}, field {field!r}"
    if err["type"] == "missing":
        return f"{where}: required but missing; add it to [pipelines.{pipeline}]"
    if err["type"] == "extra_forbidden" and field in _REPLACED:
        return f"{where}: {_REPLACED[field]}"
    if err["type"] == "extra_forbidden":
        known = ", ".join(n for n in PipelineSpec.model_fields if n != "name")
        return f"{where}: unknown field; known fields: {known}"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    if len(loc) > 1:
        msg = f"item {loc[1]}: {msg}"
    return f"{where}: {msg} (got {got!r})"


def load_pipelines(path: str | Path | None = None) -> dict[str, PipelineSpec]:
    """Read and validate the pipelines file (in file order); ConfigError names the file, pipeline and field."""
    path = Path(path) if path is not None else default_pipelines_file()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"pipelines file {path} does not exist; set KAPPA_PIPELINES or --pipelines-file "
                          f"to the file that declares your pipelines") from None
    except OSError as e:
        raise ConfigError(f"pipelines file {path} cannot be read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"pipelines file {path} is not valid TOML: {e}") from None

    extra = sorted(set(data) - {"pipelines"})
    if extra:
        raise ConfigError(f"pipelines file {path}: unknown top-level key(s) {', '.join(map(repr, extra))}; "
                          f"declare each pipeline as a [pipelines.<name>] table")
    tables = data.get("pipelines")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f"pipelines file {path} declares no pipelines; add a [pipelines.<name>] table")

    specs: dict[str, PipelineSpec] = {}
    alias_owner: dict[str, str] = {}
    for name, table in tables.items():
        try:
            validate_pipeline_name(name)
        except ConfigError as e:
            raise ConfigError(f"pipelines file {path}: [pipelines.{name}]: {e}") from None
        if not isinstance(table, dict):
            raise ConfigError(f"pipelines file {path}: pipeline {name!r} must be a table ([pipelines.{name}]), "
                              f"got {type(table).__name__}")
        if "name" in table:
            raise ConfigError(f"pipelines file {path}: pipeline {name!r}, field 'name': the name is the table's "
                              f"key ([pipelines.{name}]); remove 'name'")
        try:
            spec = PipelineSpec(name=name, **table)
        except ValidationError as e:
            raise ConfigError("; ".join(_field_error(path, name, err) for err in e.errors())) from None
        if spec.alias in alias_owner:
            raise ConfigError(
                f"pipelines file {path}: pipeline {name!r}, field 'alias': alias {spec.alias!r} is already the "
                f"alias of pipeline {alias_owner[spec.alias]!r}; every pipeline needs its own alias")
        alias_owner[spec.alias] = name
        specs[name] = spec
    return specs
