"""The headline job: a member-profile changelog becomes standardized profiles in a Delta table.

A job of the contract (`jobs.lib.contract.api`), as a team would write its own: ``transform(job)`` gets the
Kafka stream kappa configured and returns `Upserts`; kappa's runner (`jobs.lib.contract.runner`) owns the
source options, the latest row per member, the MERGE, the rejects table, checkpoint and triggers.

* transformation, DataFrame functions in the JVM: the JSON profile read once by kappa's JVM function
  (`jobs.lib.source.profiles.parse_records`: values and keys the JVM cannot vouch for go to the exact
  Python parser, which gives the reject reason in ``error``; a tombstone sets ``_deleted``);
* ``then``, on the latest row of each member only: the rules as Spark expressions
  (`jobs.lib.rules.model.Rules.column`), titles and companies.

Run by kappa as ``python -m jobs.run --job jobs.standardize:transform --key member_id ...`` (the
pipelines file says ``job = "standardize"``).
The job takes no options of its own (kappa's are ``key_order``, ``backfill``, ``source_options``,
``upkeep``: `jobs.lib.contract.runner`).
"""

from __future__ import annotations

from typing import Any, Callable

from jobs.lib.contract.api import SOURCE_COLUMNS, JobInput, Upserts
from jobs.lib.contract.runner import start_query as start_job_query
from jobs.lib.rules.model import Rules
from jobs.lib.sink.tables import CRASH_HOOK
from jobs.lib.source.profiles import DELETED, KEY_COLUMNS, parse_records
from orchestrator.core.exceptions import ConfigError, RulesError

__all__ = ["CRASH_HOOK", "JOB", "transform", "profile_rows", "standardized", "start_query"]

#: This job, as the pipelines file and the runner name it.
JOB = "jobs.standardize:transform"


def transform(job: JobInput) -> Upserts:
    """The job contract's function: Kafka records -> one profile row per record (or its reject
    reason), then the rules on the latest row of each member."""
    if job.options:
        raise ConfigError(f"the standardize job takes no options of its own, got {', '.join(map(repr, job.options))}; "
                          f"kappa's are key_order, backfill, source_options, upkeep")
    rules = job.rules
    if rules is None:
        raise RulesError("the standardize job needs a rules file: deploy it with a rules version of its ruleset")
    rows = profile_rows(job.source)
    # Sink: kappa keeps the latest row of each member, standardizes it by the rules (`then`) and
    # MERGEs it by member_id.
    return Upserts(rows, then=lambda latest: standardized(latest, rules))


def profile_rows(records: Any) -> Any:
    """Kafka records -> one profile row per record (the transform before kappa's latest row per member)."""
    from pyspark.sql import functions as F

    # Source: the profiles topic, parsed in the JVM (a malformed record keeps its reason in `error`,
    # a tombstone sets `_deleted`).
    parsed = parse_records(records)
    # Transformation: one profile row per record, the raw title and company kept for the rules.
    return parsed.select(*SOURCE_COLUMNS, "member_id", "name", F.col("title").alias("title_raw"),
                         F.col("company").alias("company_raw"), "location", "error", DELETED)


def standardized(latest: Any, rules: Rules) -> Any:
    """The latest rows with ``title`` and ``company`` by the rules, each beside its raw value."""
    from pyspark.sql import functions as F

    first = ["member_id", "name", "title_raw"]
    rest = [c for c in latest.columns if c not in (*first, "company_raw")]
    return latest.select(*first, rules.column("titles", F.col("title_raw")).alias("title"), "company_raw",
                         rules.column("companies", F.col("company_raw")).alias("company"), *rest)


def start_query(spark: Any, args: Any, rules: Rules, source_options: dict, trigger: dict, *,
                on_batch: Callable[..., None] | None = None) -> tuple[Any, Any]:
    """Start the standardize query on `spark` through kappa's runner (the benchmarks and the tests);
    returns (query, its foreachBatch function)."""
    if not getattr(args, "key", None):
        args.key = KEY_COLUMNS[0]
    return start_job_query(spark, args, JOB, transform, rules, source_options, trigger, on_batch=on_batch)
