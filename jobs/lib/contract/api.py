"""The job contract: what a pipeline's job gets from kappa and what it gives back.

A pipeline's ``job`` names a function, ``module:function``, or a module whose function is
``transform``. The module is imported from the job path (the setting ``job_path``: folders such as
a team's repository, searched before the installed packages); kappa's own jobs (``standardize``,
the seed jobs) are found the same way and are examples of this contract. The function is called
with a `JobInput` and returns `Upserts` or `Stateful`: once when the version's query starts, on the
stream (what it returns decides the sink, and is checked); then, for an `Upserts` job, once per
micro-batch, with ``source`` that batch's records, read from Kafka once and kept (persisted), as a
static DataFrame. So a job may use its source more than once (a fast path and a slow one, unioned)
without a second read of Kafka; the function only builds a plan, and must be cheap and do the same
every time. A job that reads its values with kappa's `jobs.lib.source.json_values.parse_json_values`
may be called up to three times for one micro-batch: first with that parse leaving the records the JVM
cannot vouch for to later (``error`` is ``PENDING`` there), then, when its plan keeps each of those
records and that ``error`` as they are, on those records alone with the exact parser, or else on the
batch again with the exact parser over every record (`jobs.lib.contract.runner.group_micro_batch`)::

    from pyspark.sql import functions as F
    from jobs.lib.contract.api import JobInput, Upserts

    def transform(job: JobInput) -> Upserts:
        profile = F.from_json(F.col("value").cast("string"), "name string, title string")
        rows = job.source.select("*", F.col("key").cast("string").alias("member_id"),
                                 profile["name"].alias("name"), profile["title"].alias("title_raw"))
        return Upserts(rows, then=lambda latest: job.rules.apply(latest))

What the job gets (`JobInput`): the Spark session; ``source``, the streaming DataFrame of Spark's
Kafka source over the version's topics, configured by kappa (offsets, caps, ``kafka.*`` settings and
secrets; columns ``key, value, topic, partition, offset, timestamp, timestampType``) and ``read(topic)``
for one topic of several (``topics``, in the pipelines file's order); the pipeline's own ``options``;
its ``rules`` (`jobs.lib.rules.model.Rules`, the rules stored with the version at deploy) or None; its
``key`` columns; its name and version.

What it returns:

* `Upserts` (a stateless job: one row, or none, per source record). ``rows`` is a DataFrame derived
  from ``source`` with DataFrame functions (streaming or static, as ``source`` is): the output columns, the pipeline's key
  columns among them, and the source's ``key, value, topic, partition, offset, timestamp`` columns kept
  as they are; optionally ``error`` (string: the record is malformed, this is why; such rows go to the
  rejects table, never to the output) and ``_deleted`` (boolean: the key is deleted, a tombstone).
  kappa keeps, in each micro-batch, the latest row of each key by the pipeline's key order, applies
  ``then`` (optional: a DataFrame -> DataFrame step on those latest rows only, such as the rules), and
  MERGEs them into the version's table with the source position columns ``source_partition``,
  ``source_offset`` and ``source_timestamp``.
* `Stateful` (a job with Spark's stateful operators: aggregations, stream-stream joins,
  ``applyInPandasWithState``). ``rows`` is the streaming DataFrame of output rows in ``output_mode``
  ("update" or "append"); ``write`` is "upsert" (by the key columns; ``_deleted`` deletes) or
  "append"; ``parsed`` (optional) is the DataFrame of parsed source records with ``error`` and the
  source columns, from which kappa takes the rejects and counts the records read. A job whose
  stateful function sees the raw records (``applyInPandasWithState``) may instead emit its rejects
  and counts among its rows, in the columns of `jobs.lib.runtime.seedjob.TAIL_DDL`.

kappa owns everything else: the source's options, the checkpoint, the triggers (the backfill in one
pass, then the live tail), the sink (delta-spark, idempotent by Delta's application transactions),
the rejects table, lag, status and graceful stops. A function that does not import, is not callable
with one argument, or returns something else is refused with one line naming the pipeline, the job
and what is wrong: at deploy for the import and the signature (`check_job`, in a separate process),
when the query starts for what it returns, before anything is written.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from orchestrator.core.exceptions import ContractError
from orchestrator.core.jobref import parse_job_ref, resolve_job

__all__ = ["JobInput", "Upserts", "Stateful", "SOURCE_COLUMNS", "ERROR", "DELETED", "load_job", "check_job",
           "check_result"]

#: The columns of Spark's Kafka source that an `Upserts` job keeps (kappa reads and removes them).
SOURCE_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")
ERROR = "error"
DELETED = "_deleted"


@dataclass(frozen=True)
class JobInput:
    """What a job's function is called with (see the module)."""

    spark: Any
    source: Any
    read: Callable[..., Any]
    options: dict
    rules: Any
    key: tuple[str, ...]
    topics: tuple[str, ...]
    pipeline: str
    version: int


@dataclass(frozen=True)
class Upserts:
    """A stateless job's rows, upserted by key (see the module)."""

    rows: Any
    then: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Stateful:
    """A stateful job's output stream (see the module)."""

    rows: Any
    output_mode: str = "update"
    write: str = "upsert"
    parsed: Any = None


def load_job(ref: str, job_path: list[str] | tuple[str, ...] = ()) -> Callable[[JobInput], Any]:
    """Import the job's function from the job path (then the installed packages); ContractError with
    one line naming the job and what is wrong."""
    module_name, function = parse_job_ref(ref)
    for folder in reversed([str(p) for p in job_path]):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        where = ", ".join(map(str, job_path)) or "none set"
        raise ContractError(f"job {ref!r}: module {module_name!r} not found ({e.msg}); job path: {where}. "
                            f"Add the folder that holds it to job_path (--job-path, KAPPA_JOB_PATH or "
                            f"kappa.toml), or install it") from None
    except Exception as e:
        line = str(e).splitlines()[0] if str(e) else ""
        raise ContractError(f"job {ref!r}: importing {module_name!r} failed: {type(e).__name__}: {line}") from None
    fn = getattr(module, function, None)
    if fn is None:
        raise ContractError(f"job {ref!r}: module {module_name!r} has no function {function!r}; name it "
                            f"{module_name}:<function> in the pipelines file")
    if not callable(fn):
        raise ContractError(f"job {ref!r}: {module_name}.{function} is a {type(fn).__name__}, not a function")
    try:
        sig = inspect.signature(fn)
        sig.bind(object())
    except TypeError:
        raise ContractError(f"job {ref!r}: {module_name}.{function}{sig} must take exactly one argument, the "
                            f"JobInput (def {function}(job): ...)") from None
    except ValueError:
        pass  # a builtin without a signature: called as it is
    return fn


def check_job(ref: str, job_path: list[str] | tuple[str, ...] = (), *, call: dict | None = None) -> str:
    """The job's function imports and takes one argument and, with `call` (``key``, ``topics``,
    ``options``, ``rules_file``, ``pipeline``), returns what the contract asks when called on a
    Kafka stream in a local Spark session. Checked in a separate Python process, so that the
    deploying process imports no team code. Returns ``module:function``; ContractError with the
    child's one line."""
    import json
    import os
    import subprocess

    from orchestrator.core.envvars import KAPPA_KAFKA_CONFIG, KAPPA_REGISTRY_URL

    env = {k: v for k, v in os.environ.items() if k not in (KAPPA_KAFKA_CONFIG, KAPPA_REGISTRY_URL)}  # no secrets
    request = json.dumps({"ref": ref, "job_path": [str(p) for p in job_path], "call": call})
    proc = subprocess.run([sys.executable, "-m", "jobs.lib.contract.api", request], capture_output=True, text=True,
                          timeout=300, env=env, cwd=_project_root(), stdin=subprocess.DEVNULL)
    if proc.returncode == 3:
        raise ContractError(proc.stdout.strip().splitlines()[-1])
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ContractError(f"job {ref!r}: checking it failed: {last}")
    return resolve_job(ref)


def _check_in_this_process(request: dict) -> None:
    """The child of `check_job`: exit 3 with one line when the job breaks the contract."""
    ref = request["ref"]
    fn = load_job(ref, request["job_path"])
    call = request.get("call")
    if not call:
        return
    import tempfile

    from jobs.lib.rules.files import load_rules
    from jobs.lib.runtime.session import build_session
    from jobs.lib.runtime.stream import kafka_options, kafka_reader

    rules = load_rules(call["rules_file"]) if call.get("rules_file") else None
    key = tuple(call["key"])
    with tempfile.TemporaryDirectory(prefix="kappa-contract-") as scratch:
        spark = build_session("kappa-contract-check", master="local[1]", local_dir=scratch, short_lived=True)
        try:
            read = kafka_reader(spark, kafka_options("127.0.0.1:9", ",".join(call["topics"])))
            job = JobInput(spark=spark, source=read(), read=read, options=dict(call.get("options") or {}),
                           rules=rules, key=key, topics=tuple(call["topics"]), pipeline=call["pipeline"], version=0)
            try:
                result = fn(job)
            except ContractError:
                raise
            except Exception as e:
                line = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise ContractError(f"job {ref!r} failed when called on the Kafka stream: {type(e).__name__}: "
                                    f"{line}") from None
            check_result(ref, result, key)
        finally:
            spark.stop()


def _project_root() -> str:
    return str(Path(__file__).resolve().parents[3])


def _columns(df: Any) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in df.schema.fields}


def check_result(ref: str, result: Any, key: tuple[str, ...], *, streaming: bool = True) -> Upserts | Stateful:
    """What the job returned, checked before anything runs; ContractError naming what is wrong.
    `streaming` False: the job was given a static DataFrame (`jobs.lib.contract.testing`)."""
    if not isinstance(result, (Upserts, Stateful)):
        raise ContractError(f"job {ref!r} returned {type(result).__name__}; return Upserts(rows) or "
                            f"Stateful(rows, ...) from jobs.lib.contract.api")
    if not hasattr(result.rows, "schema") or getattr(result.rows, "isStreaming", None) is not streaming:
        raise ContractError(f"job {ref!r}: rows must be a {'streaming ' if streaming else ''}DataFrame derived from "
                            f"job.source, got {type(result.rows).__name__}")
    cols = _columns(result.rows)
    missing = [k for k in key if k not in cols]
    if missing:
        raise ContractError(f"job {ref!r}: rows lack the pipeline's key column(s) {', '.join(missing)} "
                            f"(columns: {', '.join(cols)})")
    if DELETED in cols and cols[DELETED] != "boolean":
        raise ContractError(f"job {ref!r}: column {DELETED} must be boolean, got {cols[DELETED]}")
    if isinstance(result, Upserts):
        gone = [c for c in SOURCE_COLUMNS if c not in cols]
        if gone:
            raise ContractError(f"job {ref!r}: rows must keep the source's columns {', '.join(SOURCE_COLUMNS)}; "
                                f"missing {', '.join(gone)} (select(\"*\", ...) keeps them)")
        if ERROR in cols and cols[ERROR] != "string":
            raise ContractError(f"job {ref!r}: column {ERROR} must be a string (the reject reason), got {cols[ERROR]}")
        clash = [c for c in ("source_partition", "source_offset", "source_timestamp") if c in cols]
        if clash:
            raise ContractError(f"job {ref!r}: columns {', '.join(clash)} are kappa's (the source position it "
                                f"adds); rename them")
        if result.then is not None and not callable(result.then):
            raise ContractError(f"job {ref!r}: then must be a function of a DataFrame, got {type(result.then).__name__}")
        return result
    if result.output_mode not in ("update", "append"):
        raise ContractError(f"job {ref!r}: output_mode must be 'update' or 'append', got {result.output_mode!r}")
    if result.write not in ("upsert", "append"):
        raise ContractError(f"job {ref!r}: write must be 'upsert' or 'append', got {result.write!r}")
    if result.parsed is not None:
        pcols = _columns(result.parsed)
        need = [c for c in (*SOURCE_COLUMNS[:5], ERROR) if c not in pcols]
        if need:
            raise ContractError(f"job {ref!r}: parsed must have the source's columns and {ERROR}; missing "
                                f"{', '.join(need)}")
    return result


if __name__ == "__main__":
    # the module itself, not this __main__ copy: the job's Upserts and Stateful are its classes
    from jobs.lib.contract import api as _contract

    try:
        _contract._check_in_this_process(__import__("json").loads(sys.argv[1]))
    except _contract.ContractError as _e:
        print(str(_e).splitlines()[0])
        sys.exit(3)
