"""`kappa bench parse`: where the standardize job's parse spends its CPU, step by step, against Spark's own
``from_json`` in the same run.

`kappa bench reprocess` says how kappa's backfill compares with a plain Spark pipeline; this says why.
In this process, on a local Spark session, no broker: the log `kappa bench reprocess` produces (the same
generator, seed and sizes) is written once as Parquet with the Kafka source's columns, and each step
reads it and writes to Spark's ``noop`` sink, so a step costs its reading and its expressions only.
Each step runs `rounds` times in turn (the first round warms the JIT); printed for each: the lowest
wall seconds and executor CPU seconds of its rounds, the processes' CPU (the JVM and its Python
workers), and executor CPU as a ratio to the plain pipeline's ``from_json`` measured in the same run.

The steps build kappa's parse up from the read: kappa's JVM reading of each value (``kappa_json_fields``,
`jobs/lib/source/jvm/JsonFields.java`), the verdict and fields of `jobs.lib.source.profiles`' judge on
it, then the whole `parse_records` (with the Arrow UDF pass for the records the JVM cannot vouch for),
and the latest row per key on top of it (`jobs.lib.contract.runner.group_batch`) beside the plain
pipeline's. The other steps measure designs tried for the parse: the one this reading replaced (each
value into a Spark variant with ``try_parse_json``, then the profile fields' types from
``schema_of_variant`` and their strings from ``try_variant_get``, as its judge read them), and one not
adopted (``from_json`` into variant-typed profile fields, one Jackson pass that skips unknown fields,
then the fields' types and strings from those small variants).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from jobs.lib.source.profiles import PROFILE_FIELDS
from orchestrator.dev.benchutil import process_cpu_seconds

__all__ = ["STEPS", "run_parse_bench", "write_log", "parse_lines"]


def _text() -> Any:
    from pyspark.sql import functions as F

    return F.col("value").cast("string")


def _read(src: Any) -> Any:
    return src.select("key", "value", "partition")


def _from_json(src: Any) -> Any:
    from pyspark.sql import functions as F

    from orchestrator.dev.plainspark import PROFILE_SCHEMA

    return src.select("key", "partition", F.from_json(_text(), PROFILE_SCHEMA).alias("p")).select("key", "partition", "p.*")


def _jvm_fields(src: Any) -> Any:
    from pyspark.sql import functions as F

    from jobs.lib.runtime.jvm import JSON_FIELDS, register

    register(src.sparkSession)
    return src.select("key", "value", "partition",
                      F.call_function(JSON_FIELDS, F.col("value"), F.lit(",".join(PROFILE_FIELDS))).alias("d"))


def _judged(src: Any) -> Any:
    from pyspark.sql import functions as F

    from jobs.lib.source.json_values import Fields
    from jobs.lib.source.profiles import judge_profile

    ok, fields = judge_profile(Fields(F.col("d"), PROFILE_FIELDS))
    verdict = F.struct(ok.alias("ok"), F.struct(*[c.alias(n) for n, c in fields.items()]).alias("v"))
    return _jvm_fields(src).select(verdict.alias("j")).select("j.ok", "j.v.*")


def _variant(src: Any) -> Any:
    from pyspark.sql import functions as F

    return src.select("key", "value", "partition", F.expr("try_parse_json(cast(value AS string))").alias("d"))


def _variant_types(src: Any) -> Any:
    from pyspark.sql import functions as F

    return _variant(src).select(*[F.schema_of_variant(F.variant_get("d", f"$.{f}", "variant")).alias(f)
                                  for f in PROFILE_FIELDS])


def _variant_judged(src: Any) -> Any:
    """The replaced design's judge: the fields' types, then their strings from one ``try_variant_get``."""
    from pyspark.sql import functions as F

    doc = F.col("d")
    typ = {f: F.schema_of_variant(F.variant_get(doc, f"$.{f}", "variant")) for f in PROFILE_FIELDS}
    ok = F.coalesce(typ["name"] == "STRING", F.lit(False))
    for f in PROFILE_FIELDS[1:]:
        ok = ok & (typ[f].isNull() | typ[f].isin("STRING", "VOID"))
    strings = F.try_variant_get(doc, "$", "struct<" + ", ".join(f"{f}: string" for f in PROFILE_FIELDS) + ">")
    verdict = F.struct((doc.isNotNull() & ok).alias("ok"),
                       F.struct(*[strings[f].alias(f) for f in PROFILE_FIELDS]).alias("v"))
    return _variant(src).select(verdict.alias("j")).select("j.ok", "j.v.*")


def _parse_records(src: Any) -> Any:
    from jobs.lib.source.profiles import parse_records

    return parse_records(src)


#: Spark's JSON options of the design tried: what Python's json refuses, Jackson refuses too.
_STRICT_JSON = {"allowSingleQuotes": "false", "allowNonNumericNumbers": "false",
                "columnNameOfCorruptRecord": "__corrupt", "mode": "PERMISSIVE"}


def _variant_fields(src: Any) -> Any:
    from pyspark.sql import functions as F

    schema = ", ".join(f"{f} variant" for f in PROFILE_FIELDS) + ", __corrupt string"
    return src.select("key", "value", "partition", F.from_json(_text(), schema, _STRICT_JSON).alias("p"))


def _variant_fields_strings(src: Any) -> Any:
    from pyspark.sql import functions as F

    both = F.struct(*[F.schema_of_variant(F.col(f"p.{f}")).alias(f"{f}_type") for f in PROFILE_FIELDS],
                    *[F.col(f"p.{f}").cast("string").alias(f) for f in PROFILE_FIELDS])
    return _variant_fields(src).select(both.alias("j")).select("j.*")


def _plain_latest(src: Any) -> Any:
    from pyspark.sql import functions as F

    from orchestrator.dev.plainspark import PROFILE_SCHEMA, latest_per_key

    return latest_per_key(src.select(F.col("key").cast("string").alias("member_id"),
                              F.from_json(_text(), PROFILE_SCHEMA).alias("p"), F.col("value").isNull().alias("deleted"),
                              "partition", "offset", "timestamp"))


def _kappa_latest(src: Any) -> Any:
    from jobs.lib.contract.runner import group_batch, output_columns
    from jobs.standardize import profile_rows

    rows = profile_rows(src)
    return group_batch(rows, output_columns(rows), "member_id", "partition")


#: (name, what it measures, the step's DataFrame over the log). ``from_json`` is the reference.
STEPS: list[tuple[str, str, Callable[[Any], Any]]] = [
    ("read", "the log's key, value and partition read, nothing else (the floor)", _read),
    ("from_json", "the plain pipeline's parse: from_json with the profile schema (reference)", _from_json),
    ("jvm_fields", "kappa's reading alone: each value read once by kappa_json_fields (Java, Jackson)", _jvm_fields),
    ("field_strings", "+ the judge's verdict and the fields' strings: the JVM's whole reading", _judged),
    ("parse_records", "kappa's parse: + the Arrow UDF pass for what the JVM leaves to the exact parser", _parse_records),
    ("try_parse_json", "design replaced: each value into a variant", _variant),
    ("variant_types", "design replaced: + the profile fields' types (schema_of_variant)", _variant_types),
    ("variant_strings", "design replaced: + their strings (try_variant_get): its whole reading", _variant_judged),
    ("variant_fields", "design tried: from_json into variant-typed profile fields", _variant_fields),
    ("variant_fields_strings", "design tried: + the fields' types and strings", _variant_fields_strings),
    ("plain_latest", "the plain pipeline: from_json and the latest row per key", _plain_latest),
    ("kappa_latest", "kappa: parse_records and the latest row per key (group_batch)", _kappa_latest),
]


def write_log(path: Path, records: int, keys: int, *, partitions: int = 4, value_size: int = 200,
              malformed_share: float = 0.0, delete_share: float = 0.02, seed: int = 42) -> int:
    """The log `kappa bench reprocess` produces, as Parquet with the Kafka source's columns (key, value,
    topic, partition, offset, timestamp); returns the bytes of its values."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.dev.datagen import generate_changelog, partition_for

    keys_, values, parts, offsets = [], [], [], []
    next_offset = [0] * partitions
    size = 0
    for rec in generate_changelog(records, keys, seed=seed, value_size=value_size, malformed_share=malformed_share,
                                  delete_share=delete_share):
        p = partition_for(rec.key, partitions)
        keys_.append(rec.key)
        values.append(rec.value)
        parts.append(p)
        offsets.append(next_offset[p])
        next_offset[p] += 1
        size += len(rec.value or b"")
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    table = pa.table({"key": pa.array(keys_, pa.binary()), "value": pa.array(values, pa.binary()),
                      "topic": pa.array(["bench_profiles"] * len(keys_), pa.string()),
                      "partition": pa.array(parts, pa.int32()), "offset": pa.array(offsets, pa.int64()),
                      "timestamp": pa.array([start + datetime.timedelta(milliseconds=i) for i in range(len(keys_))],
                                            pa.timestamp("us", tz="UTC"))})
    pq.write_table(table, path, row_group_size=100_000)
    return size


def run_parse_bench(records: int = 2_000_000, keys: int = 500_000, *, value_size: int = 200,
                    malformed_share: float = 0.0, rounds: int = 2, steps: list[str] | None = None,
                    workdir: Path | None = None, console=None, spark=None) -> dict[str, Any]:
    """Write the log, then run each step `rounds` times in turn (see the module). `steps` picks some by name
    (``from_json``, the reference, always runs)."""
    from orchestrator.core.exceptions import ConfigError

    say = console.print if console is not None else (lambda *a, **k: None)
    known = [name for name, _, _ in STEPS]
    unknown = [s for s in (steps or []) if s not in known]
    if unknown:
        raise ConfigError(f"bench parse: no step {', '.join(map(repr, unknown))}; the steps: {', '.join(known)}")
    chosen = [s for s in known if steps is None or s in steps or s == "from_json"]
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="kappa-bench-parse-")) if own else Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    session = spark
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in chosen}
    try:
        say(f"writing {records:,} records (~{value_size} B values, {keys:,} keys) as Parquet with the Kafka "
            f"source's columns...")
        log = work / "log.parquet"
        value_bytes = write_log(log, records, keys, value_size=value_size, malformed_share=malformed_share)
        if session is None:
            from jobs.lib.runtime.session import build_session

            say("starting Spark (local, the jobs' settings)...")
            session = build_session("kappa-bench-parse", local_dir=str(work / "spark-local"))
        from jobs.lib.runtime.sparkwork import executor_time

        src = session.read.parquet(str(log))
        build = {name: fn for name, _, fn in STEPS}
        for r in range(1, rounds + 1):
            for name in chosen:
                frame = build[name](src)
                cpu0, proc0, t0 = executor_time(session), process_cpu_seconds(), time.perf_counter()
                frame.write.format("noop").mode("overwrite").save()
                seconds = time.perf_counter() - t0
                cpu1, proc1 = executor_time(session), process_cpu_seconds()
                one = {"seconds": round(seconds, 3),
                       "executor_cpu_seconds": round(cpu1.cpu_seconds - cpu0.cpu_seconds, 3) if cpu0 and cpu1 else None,
                       "process_cpu_seconds": round(proc1 - proc0, 3)}
                runs[name].append(one)
                say(f"  round {r}/{rounds} {name}: {one['seconds']:.2f} s, executor CPU "
                    f"{one['executor_cpu_seconds'] or 0:.2f} s, processes {one['process_cpu_seconds']:.2f} s")
    finally:
        if session is not None and spark is None:
            session.stop()
        if own:
            shutil.rmtree(work, ignore_errors=True)
    labels = {name: label for name, label, _ in STEPS}
    best = {name: {k: min((run[k] for run in rs if run[k] is not None), default=None)
                   for k in ("seconds", "executor_cpu_seconds", "process_cpu_seconds")} for name, rs in runs.items()}
    ref = best["from_json"]["executor_cpu_seconds"]
    figures = {"records": records, "keys": keys, "value_size": value_size, "value_bytes": value_bytes,
               "malformed_share": malformed_share, "rounds": rounds,
               "steps": [{"step": name, "what": labels[name], **best[name],
                          "ratio_to_from_json": (round(best[name]["executor_cpu_seconds"] / ref, 3)
                                                 if ref and best[name]["executor_cpu_seconds"] is not None else None),
                          "rounds": runs[name]} for name in chosen]}
    for line in parse_lines(figures):
        say(line)
    return figures


def parse_lines(f: dict[str, Any]) -> list[str]:
    """The summary lines (pure: tested)."""
    lines = [f"the parse of {f['records']:,} records ({f['value_bytes'] / 1e6:.1f} MB of values), the lowest of "
             f"{f['rounds']} round(s) each; executor CPU as a ratio to from_json's in the same run:"]
    width = max(len(s["step"]) for s in f["steps"])
    for s in f["steps"]:
        cpu = s["executor_cpu_seconds"]
        ratio = s["ratio_to_from_json"]
        lines.append(f"  {s['step']:<{width}}  {s['seconds']:6.2f} s  executor CPU {cpu if cpu is not None else float('nan'):6.2f} s"
                     f"  processes {s['process_cpu_seconds']:6.2f} s  "
                     f"{'x' + format(ratio, '.2f') if ratio is not None else '  -  '}  {s['what']}")
    return lines
