"""`kappa bench reprocess|deploy`: how fast a full standardize reprocess reads a log, and how long
a deploy takes to become a promoted version.

`run_deploy_bench` times deploy -> ready -> promote on the demo's embedded stack (see its
docstring). `run_reprocess_bench` measures a reprocess against the fastest raw read of the same
log on the same machine; one run, on an embedded broker started for it (or on `bootstrap`):

1. produce `records` member-profile changes over `keys` members into a `partitions`-partition
   compacted topic (the broker's segment defaults, so the cleaner leaves it whole); the producer
   batches (lz4) for speed;
2. the references: Kafka's own `ConsumerPerformance` (the Java consumer) reading the topic; one
   confluent-kafka consumer per core, each in its own process, the partitions divided among them
   (`orchestrator.dev.benchref`); also one consumer alone, for comparison;
3. a full standardize reprocess from offset zero into an empty Delta table, in a process of its
   own (`orchestrator.dev.benchjob`: the job as the runtime starts it, `build(ctx)`, so whatever
   data path the job has is what is measured). Spark start-up is timed on its own, then the
   available-now query from start to end; the time breakdown comes from Spark's progress reports
   and from the job's own stage timings where it exposes them;
4. the second reference, in a process of its own too: a plain Spark pipeline on the same topic
   (`orchestrator.dev.plainspark`: Kafka source, ``from_json``, latest row per key, Delta write; no
   kappa code), so that the ratio to it says what kappa's own work costs;
5. a self-check of what the benchmark can verify without the rules: every member's last
   upsert as the generator made it (told by the record's kind, not by parsing the log) against
   the output's raw columns (member_id, name, title_raw, company_raw, location), and the number
   of malformed records against the rows of the rejects table. What the rules make of titles and
   companies is not checked here (that would mean running the rules engine against itself): the
   test suite compares the kept output (`workdir`) with its own golden mapping.

Throughput counts key + value bytes. Beside each Spark run's wall time: its executor CPU seconds
(Spark's status store, `jobs.lib.runtime.sparkwork`) and its processes' CPU seconds, since a busy
machine stretches wall time several-fold while CPU seconds hardly move. Peak memory is the largest sum of resident memory of the
reprocess's process and its children (the Spark JVM and its Python workers), sampled every 0.2 s.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.envvars import KAPPA_SPARK_MASTER
from orchestrator.core.exceptions import BrokerError, ConfigError
from orchestrator.core.tables import count_rows, read_table
from orchestrator.dev.benchref import FETCH_TUNING, consumer_performance, parallel_raw_consume, raw_consume
from orchestrator.dev.benchutil import rate, ratio, write_figures

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["FETCH_TUNING", "raw_consume", "expected_raw", "compare_raw", "check_against_generator",
           "validate_sizes", "breakdown_lines", "run_reprocess_bench",
           "run_deploy_bench", "main"]
RAW_COLUMNS = ("member_id", "name", "title_raw", "company_raw", "location")
NOT_CHECKED = "title and company (the rules' output): the test suite checks them against its golden file"
SPARK_NOTE = "excluding Spark start-up"


def validate_sizes(records: int, keys: int, partitions: int, value_size: int = 200) -> None:
    """ConfigError (one line, naming the option) for sizes a benchmark cannot run with."""
    for name, v, least in (("--records", records, 1), ("--keys", keys, 1), ("--partitions", partitions, 1),
                           ("--value-size", value_size, 50)):
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ConfigError(f"{name} must be an integer of at least {least}, got {v!r}")
    if keys > records:
        raise ConfigError(f"--keys ({keys:,}) cannot exceed --records ({records:,}): the first records create "
                          f"every member once")


def expected_raw(changes) -> tuple[Any, int]:
    """(each member's last upsert's raw columns as a table sorted by member_id, malformed records)
    from the generator's records (ChangeRecord, in produce order)."""
    import pyarrow as pa

    last: dict[bytes, bytes] = {}
    malformed = 0
    for rec in changes:
        if rec.kind == "upsert":
            last[rec.key] = rec.value
        elif rec.kind == "tombstone":
            last.pop(rec.key, None)
        else:
            malformed += 1
    ids = sorted(last)
    docs = [json.loads(last[k]) for k in ids]
    fields = {"name": "name", "title_raw": "title", "company_raw": "company", "location": "location"}
    table = pa.table({"member_id": pa.array([k.decode() for k in ids], pa.string()),
                      **{c: pa.array([d.get(f) for d in docs], pa.string()) for c, f in fields.items()}})
    return table, malformed


def compare_raw(output, rejects: int, expected, malformed: int) -> dict[str, Any]:
    """The self-check of step 4 (module docstring) against `expected_raw`'s result."""
    import pyarrow as pa

    got = output.select(list(RAW_COLUMNS)).sort_by("member_id")
    got = pa.table({c: got[c].cast(pa.string()) for c in RAW_COLUMNS})
    return {"rows": output.num_rows, "expected_rows": expected.num_rows, "raw_columns_match": got.equals(expected),
            "rejects": rejects, "expected_rejects": malformed, "rejects_match": rejects == malformed,
            "not_checked": NOT_CHECKED}


def check_against_generator(output, rejects: int, changes) -> dict[str, Any]:
    """The self-check of step 4: `output` the job's table, `rejects` its count, `changes` the
    generator's records (ChangeRecord, in produce order)."""
    expected, malformed = expected_raw(changes)
    return compare_raw(output, rejects, expected, malformed)


def first_batch_seconds(spark_breakdown: dict) -> float:
    """A query's start to its first batch (to the first trigger, then that batch's planning phases)."""
    return round(spark_breakdown.get("until_first_trigger", 0) + spark_breakdown.get("first_batch_planning", 0), 3)


def reprocess_figures(job: dict, total_bytes: int, records: int) -> dict[str, Any]:
    """The reprocess's figures from `benchjob.run_in_child`'s result."""
    sp = job["spark"]
    breakdown = {"spark_startup": job["startup"],
                 "query_start_to_first_batch": first_batch_seconds(sp),
                 **{f"spark_{k}": v for k, v in sp.items() if k not in ("batches",)},
                 **{f"job_{k}": v for k, v in job["stages"].items()}}
    return {"reprocess": {**rate(records, total_bytes, job["seconds"]), "batches": job["batches"],
                          "master": job["master"]},
            "reprocess_with_startup": rate(records, total_bytes, job["seconds"] + job["startup"]),
            "spark_startup_seconds": job["startup"], "time_breakdown_seconds": breakdown,
            "job_stages_exposed": job["stages_exposed"], "spark_jobs": job.get("spark_jobs"),
            "executor": job.get("executor"), "process_cpu_seconds": job.get("process_cpu_seconds"),
            "peak_memory_mb": round(job["peak_memory_bytes"] / 1e6)}


def breakdown_lines(f: dict) -> list[str]:
    """The printed lines on ratios, where the time went and memory (pure: tested)."""
    lines = []
    ref, one, s = f.get("reference"), f.get("raw_consumer"), f.get("reprocess")
    if s and ref:
        lines.append(f"ratio to the reference ({ref['processes']} consumer processes): {f['ratio_to_reference']:.3f} "
                     f"of {ref['records_per_s']:,} records/s, {ref['mb_per_s']:.1f} MB/s"
                     + (f"; to one consumer: {f['ratio_to_one_consumer']:.3f}" if one else ""))
    plain = f.get("plain_spark")
    if s and plain:
        pex = plain.get("executor") or {}
        lines.append(f"ratio to the plain Spark pipeline on the same log: {f['ratio_to_plain_spark']:.3f} of "
                     f"{plain['records_per_s']:,} records/s, {plain['mb_per_s']:.1f} MB/s ({plain['rows']:,} rows; executor "
                     f"CPU {pex.get('cpu_seconds', 0):.1f} s, processes {plain.get('process_cpu_seconds') or 0:.1f} s of CPU)")
    perf = f.get("consumer_performance")
    if s and perf:
        lines.append(f"ratio to Kafka's ConsumerPerformance: {f['ratio_to_consumer_performance']:.3f} of "
                     f"{perf['records_per_s']:,} records/s, {perf['mb_per_s']:.1f} MB/s (values only)")
    b = f.get("time_breakdown_seconds")
    if b:
        phases = ", ".join(f"{k} {b.get('spark_' + k, 0):.2f}" for k in
                           ("latestOffset", "walCommit", "getBatch", "queryPlanning", "addBatch", "commitOffsets"))
        lines.append(f"where the time goes (s): Spark start-up {b['spark_startup']:.2f}; query start to first batch "
                     f"{b['query_start_to_first_batch']:.2f} (to the first trigger "
                     f"{b.get('spark_until_first_trigger', 0):.2f}, its planning "
                     f"{b.get('spark_first_batch_planning', 0):.2f}"
                     + (f"; the plain Spark pipeline's {plain['query_start_to_first_batch']:.2f}, to its first trigger "
                        f"{plain['until_first_trigger']:.2f}" if plain and "query_start_to_first_batch" in plain else "")
                     + f"); Spark phases over all batches: {phases} "
                     f"(addBatch is the job's batch work, commitOffsets the checkpoint commit); after the last "
                     f"trigger {b.get('spark_after_last_trigger', 0):.2f}")
        stages = {k[4:]: v for k, v in b.items() if k.startswith("job_")}
        if stages:
            lines.append("the job's own stages (s, summed over batches): "
                         + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
        else:
            lines.append("the job's own stages: not exposed (build(ctx) sets no ctx.stage_timings)")
    ex = f.get("executor")
    if s and ex:
        lines.append(f"CPU: executor CPU {ex['cpu_seconds']:.1f} s (executor run time {ex['run_seconds']:.1f} s, GC "
                     f"{ex['gc_seconds']:.1f} s, {ex['stages']} stages, {f.get('spark_jobs')} Spark jobs) and the "
                     f"job's processes {f.get('process_cpu_seconds', 0):.1f} s of CPU, beside {s['seconds']:.1f} s of "
                     f"wall time (a busy machine stretches wall time, not CPU seconds)")
        if ex.get("top"):
            lines.append("costliest stages (executor run s / CPU s): " + "; ".join(
                f"{t['name'].split(' at ')[0][:40]} [{t['tasks']} tasks] {t['run_seconds']:.1f}/{t['cpu_seconds']:.1f}"
                for t in ex["top"]))
    if "peak_memory_mb" in f:
        lines.append(f"peak memory (the reprocess's process + Spark JVM + Python workers): {f['peak_memory_mb']:,} MB")
    return lines


def _print(console, f: dict) -> None:
    from rich.table import Table

    t = Table(title="kappa bench reprocess", show_lines=False)
    for col, j in (("", "left"), ("records/s", "right"), ("MB/s", "right"), ("seconds", "right"), ("notes", "left")):
        t.add_column(col, justify=j)

    def row(name: str, r: dict, note: str) -> None:
        t.add_row(name, f"{r['records_per_s']:,}", f"{r['mb_per_s']:.1f}", f"{r['seconds']:.1f}", note)

    if f.get("produce"):
        row("produce (lz4 batches)", f["produce"], "")
    if f.get("consumer_performance"):
        cp = f["consumer_performance"]
        row("Kafka ConsumerPerformance", cp, f"Java consumer, fetch phase (whole run {cp['whole_seconds']:.1f} s "
                                             f"with JVM start and group join); values only")
    if f.get("reference"):
        ref = f["reference"]
        row("raw read (reference)", ref, f"{ref['processes']} processes, one confluent-kafka consumer each, GC off")
    if f.get("raw_consumer"):
        row("  one consumer alone", f["raw_consumer"], "one process, GC off")
    s = f.get("reprocess")
    if f.get("plain_spark"):
        row("plain Spark pipeline", f["plain_spark"], "the same log, no kappa code (reference); excluding Spark start-up")
    if s:
        row("standardize reprocess", s, f"{SPARK_NOTE}; {s['batches']} micro-batches; master {s['master']}")
        row("  with Spark start-up", f["reprocess_with_startup"], f"start-up {f['spark_startup_seconds']:.1f} s")
    console.print(t)
    for line in breakdown_lines(f):
        console.print(line, highlight=False, markup=False)
    c = f.get("check")
    if c:
        def verdict(ok: bool) -> str:
            return "[green]yes[/]" if ok else "[red]NO[/]"

        console.print(f"output's raw columns match the generated records: {verdict(c['raw_columns_match'])} "
                      f"({c['rows']:,} rows, expected {c['expected_rows']:,})")
        console.print(f"rejects match the malformed records: {verdict(c['rejects_match'])} ({c['rejects']:,}, "
                      f"expected {c['expected_rejects']:,})")
        console.print(f"not checked here: {c['not_checked']}")


def run_reprocess_bench(records: int = 2_000_000, keys: int = 500_000, partitions: int = 4,
                        value_size: int = 200, json_out: str | Path | None = None, *,
                        max_records_per_batch: int = 500_000, rules_version: str = "v2",
                        malformed_share: float = 0.0, delete_share: float = 0.02, seed: int = 42,
                        bootstrap: str | None = None, kafka_config: dict | None = None,
                        master: str | None = None, workdir: str | Path | None = None,
                        extra: dict | None = None, reference_processes: int | None = None,
                        single_consumer: bool = True, verify: bool = True, console=None) -> dict[str, Any]:
    """Run the reprocess benchmark (module docstring); print a table, return (and optionally write) figures."""
    import os

    from rich.console import Console

    from jobs.lib.rules.files import rules_path
    from orchestrator.dev.benchjob import run_in_child
    from orchestrator.dev.broker import EmbeddedBroker
    from orchestrator.dev.datagen import ensure_topic, generate_changelog, produce

    validate_sizes(records, keys, partitions, value_size)
    if reference_processes is not None and reference_processes < 1:
        raise ConfigError(f"--reference-processes must be at least 1, got {reference_processes}")
    console = console or Console()
    rules_file = str(rules_path("titles", rules_version))
    own_dir = workdir is None
    work = Path(tempfile.mkdtemp(prefix="kappa-bench-")) if own_dir else Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    broker = None
    master = master or os.environ.get(KAPPA_SPARK_MASTER, "local[2]")
    figures: dict[str, Any] = {
        "params": {"records": records, "keys": keys, "partitions": partitions, "value_size": value_size,
                   "max_records_per_batch": max_records_per_batch, "rules": rules_version,
                   "malformed_share": malformed_share, "delete_share": delete_share, "seed": seed,
                   "master": master, "extra": extra or {}},
        "pids_started": [],
    }
    changes = dict(seed=seed, value_size=value_size, malformed_share=malformed_share, delete_share=delete_share)
    try:
        if bootstrap is None:
            broker = EmbeddedBroker(work / "broker").start()
            bootstrap = broker.bootstrap_servers
            figures["pids_started"].append(broker.proc.pid)
        topic = f"bench_profiles_{time.time_ns() % 10**9}"
        figures["topic"] = topic
        ensure_topic(bootstrap, topic, partitions, config=kafka_config)
        console.print(f"producing {records:,} records (~{value_size} B values, {keys:,} keys, {partitions} partitions) "
                      f"to {topic} on {bootstrap} (lz4 batches)")
        stats = produce(bootstrap, topic, generate_changelog(records, keys, **changes),
                        batching=True, partitions=partitions, config=kafka_config)
        figures["produce"] = rate(stats.records, stats.bytes, stats.seconds)

        console.print("reference: Kafka's ConsumerPerformance reading the topic...")
        perf = consumer_performance(bootstrap, topic, records, kafka_config)
        figures["consumer_performance"] = {**rate(perf["records"], perf["bytes"], perf["seconds"]),
                                           "whole_seconds": round(perf["whole_seconds"], 2),
                                           "bytes_counted": "values only"}

        n = reference_processes or os.cpu_count() or 1
        console.print(f"reference: {n} confluent-kafka consumer processes reading the partitions in parallel...")
        ref = parallel_raw_consume(bootstrap, topic, n, kafka_config)
        figures["pids_started"] += ref["pids"]
        figures["reference"] = {**rate(ref["records"], ref["bytes"], ref["seconds"]), "processes": ref["processes"],
                                "per_process": ref["per_process"]}
        if ref["records"] != records:
            raise BrokerError(f"the reference read {ref['records']:,} records of {topic}, {records:,} were "
                              f"produced: another producer wrote to the topic, or the cleaner compacted it")
        if single_consumer:
            console.print("and one consumer alone...")
            one = raw_consume(bootstrap, topic, kafka_config)
            figures["raw_consumer"] = rate(one["records"], one["bytes"], one["seconds"])

        console.print(f"standardize reprocess from offset zero into an empty Delta table (available-now, {master})...")
        job = run_in_child({"bootstrap": bootstrap, "topic": topic, "work": str(work), "rules_file": rules_file,
                            "max_records_per_batch": max_records_per_batch, "master": master,
                            "kafka_config": kafka_config or {}, "extra": extra or {}, "total": records},
                           work, console)
        figures["pids_started"].append(job["child_pid"])
        figures.update(reprocess_figures(job, ref["bytes"], records))
        console.print("reference: a plain Spark pipeline on the same log (Kafka source, from_json, latest row per key, "
                      "Delta write; no kappa code)...")
        plain = run_in_child({"bootstrap": bootstrap, "topic": topic, "work": str(work / "plain"),
                              "rules_file": rules_file, "max_records_per_batch": max_records_per_batch,
                              "master": master, "kafka_config": kafka_config or {}, "total": records,
                              "pipeline": "plain"}, work / "plain", console, label="plain")
        figures["pids_started"].append(plain["child_pid"])
        figures["plain_spark"] = {**rate(records, ref["bytes"], plain["seconds"]), "rows": count_rows(plain["output"]),
                                  "spark_startup_seconds": plain["startup"], "executor": plain.get("executor"),
                                  "query_start_to_first_batch": first_batch_seconds(plain["spark"]),
                                  "until_first_trigger": round(plain["spark"].get("until_first_trigger", 0), 3),
                                  "process_cpu_seconds": plain.get("process_cpu_seconds"),
                                  "peak_memory_mb": round(plain["peak_memory_bytes"] / 1e6)}
        figures["reprocess"]["rejects"] = count_rows(job["rejects"])
        figures["ratio_to_reference"] = ratio(figures["reprocess"]["records_per_s"],
                                              figures["reference"]["records_per_s"])
        figures["ratio_to_plain_spark"] = ratio(figures["reprocess"]["records_per_s"],
                                                figures["plain_spark"]["records_per_s"])
        figures["ratio_to_consumer_performance"] = ratio(figures["reprocess"]["records_per_s"],
                                                         figures["consumer_performance"]["records_per_s"])
        if single_consumer:
            figures["ratio_to_one_consumer"] = ratio(figures["reprocess"]["records_per_s"],
                                                     figures["raw_consumer"]["records_per_s"])
        if verify:
            console.print("checking the output's raw columns and the rejects against the generated records...")
            figures["check"] = check_against_generator(read_table(job["output"]), figures["reprocess"]["rejects"],
                                                       generate_changelog(records, keys, **changes))
    finally:
        if broker is not None:
            broker.stop()
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)
    _print(console, figures)
    write_figures(json_out, figures)
    return figures


def run_deploy_bench(records: int = 2_000_000, keys: int = 500_000, *, partitions: int = 4, value_size: int = 200,
                     rules: str = "v2", poll: float = 0.5, deadline: float = 3600.0, console: Console | None = None,
                     overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Time from `deploy` to a finished `promote` of a version over a `records`-record log, Spark start-up included.

    On the embedded stack in a temporary home, with a quiet topic (no live producer), so the
    version is ready when its lag is 0 for the pipeline's consecutive samples. Phases: the deploy
    call (checks, version allocation, job spawn), Spark start-up (until the job reports running),
    the backfill (until lag is first 0), the readiness confirmation (the consecutive samples), and
    the promote (checks, report, flip, publish). Everything started is stopped by PID.
    """
    from time import perf_counter

    from rich.console import Console

    import os

    from jobs.lib.runtime.sparkwork import event_log_time
    from orchestrator.core.envvars import KAPPA_SPARK_EVENT_LOG_DIR
    from orchestrator.dev.benchutil import process_cpu_seconds
    from orchestrator.dev.demo import ACTOR, PIPELINE, Demo, DemoOptions
    from orchestrator.lifecycle.await_ready import wait_ready
    from orchestrator.lifecycle.deploy import deploy
    from orchestrator.lifecycle.promote import promote
    from orchestrator.observe.progress import LagProgress

    console = console or Console(highlight=False)
    opts = DemoOptions(records=records, keys=keys, partitions=partitions, value_size=value_size,
                       malformed_share=0.0, clean=True, batch=None)
    bench = Demo(opts, console, overrides)
    figures: dict[str, Any] = {"params": {"records": records, "keys": keys, "partitions": partitions,
                                          "value_size": value_size, "rules": rules, "poll_seconds": poll}}
    ok = False
    events_env = os.environ.get(KAPPA_SPARK_EVENT_LOG_DIR)
    try:
        bench.home = bench._make_home()
        events = bench.home / "spark-events"
        os.environ[KAPPA_SPARK_EVENT_LOG_DIR] = str(events)     # the version's job inherits it
        bench.section("Embedded broker and a compacted topic")
        bench.start_broker()
        bench.fill_topic()
        spec = bench.k.pipeline(PIPELINE)
        bench.section(f"deploy -> ready -> promote of {records:,} records (rules {rules})")
        marks: dict[str, float] = {}
        t0 = perf_counter()
        info = deploy(bench.k, spec, rules, actor=ACTOR, reason="deploy-to-promote benchmark", threshold=0)
        marks["deployed"] = perf_counter()
        if info.pid:
            bench.started.job_pids[info.version] = info.pid
        bench.say(info.message)

        with LagProgress(console, line_every=5.0) as bars:
            def on_sample(r) -> None:
                now = perf_counter()
                if "running" not in marks and r.job.get("health") == "running":
                    marks["running"] = now
                if "caught_up" not in marks and r.total_lag is not None and r.total_lag <= r.threshold:
                    marks["caught_up"] = now
                bars.update(r)

            v = bench.k.version(spec, info.version)
            wait_ready(v, deadline_seconds=deadline, poll_seconds=poll,
                       on_sample=on_sample, actor=ACTOR)
        marks["ready"] = perf_counter()
        res = promote(v, actor=ACTOR, reason="deploy-to-promote benchmark")
        marks["promoted"] = perf_counter()
        job_cpu = process_cpu_seconds(info.pid) if info.pid else None
        bench.say(res.message)
        running = marks.get("running", marks["deployed"])
        caught = marks.get("caught_up", marks["ready"])
        figures.update({
            "deploy_to_promote_seconds": round(marks["promoted"] - t0, 2),
            "phases_seconds": {
                "deploy_call": round(marks["deployed"] - t0, 2),
                "spark_startup": round(running - marks["deployed"], 2),
                "backfill": round(caught - running, 2),
                "readiness_confirmation": round(marks["ready"] - caught, 2),
                "promote": round(marks["promoted"] - marks["ready"], 2),
            },
            "backfill_records_per_s": round(records / max(caught - running, 1e-9)),
            "catchup_samples": spec.catchup_samples,
            "version": info.version,
            "job_process_cpu_seconds": job_cpu,
        })
        ok = True
    finally:
        stopped = bench.cleanup()
        for what, pid in stopped:
            console.print(f"stopped {what} (pid {pid})", highlight=False)
        if ok:
            figures["executor"] = event_log_time(events).as_dict()
        if events_env is None:
            os.environ.pop(KAPPA_SPARK_EVENT_LOG_DIR, None)
        else:
            os.environ[KAPPA_SPARK_EVENT_LOG_DIR] = events_env
        if bench.home is not None:
            shutil.rmtree(bench.home, ignore_errors=True)
    if ok:
        ph = figures["phases_seconds"]
        console.print(f"[bold]deploy -> promote: {figures['deploy_to_promote_seconds']:.1f} s[/] for {records:,} records "
                      f"(deploy call {ph['deploy_call']:.1f} s, Spark start-up {ph['spark_startup']:.1f} s, backfill "
                      f"{ph['backfill']:.1f} s = {figures['backfill_records_per_s']:,} records/s, readiness "
                      f"confirmation {ph['readiness_confirmation']:.1f} s ({spec.catchup_samples} samples every "
                      f"{poll:g} s), promote {ph['promote']:.1f} s)", highlight=False)
        ex = figures["executor"]
        console.print(f"CPU: the job's executor CPU {ex['cpu_seconds']:.1f} s (run time {ex['run_seconds']:.1f} s, "
                      f"Spark's event log) and its processes {figures['job_process_cpu_seconds'] or 0:.1f} s of CPU "
                      f"until the promote, beside {figures['deploy_to_promote_seconds']:.1f} s of wall time",
                      highlight=False)
    return figures


def main(argv: list[str] | None = None) -> None:
    """`python -m orchestrator.dev.bench` (the CLI's `kappa bench reprocess` calls run_reprocess_bench)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m orchestrator.dev.bench", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--keys", type=int, default=500_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--value-size", type=int, default=200)
    p.add_argument("--max-records-per-batch", type=int, default=500_000)
    p.add_argument("--rules", default="v2")
    p.add_argument("--malformed-share", type=float, default=0.0)
    p.add_argument("--extra", type=json.loads, default=None, help="the job's --extra (JSON object)")
    p.add_argument("--master", default=None, help="Spark master (default KAPPA_SPARK_MASTER or local[2])")
    p.add_argument("--reference-processes", type=int, default=None, help="default: one per core")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--bootstrap", default=None, help="produce to this broker instead of an embedded one")
    p.add_argument("--workdir", default=None, help="work here and keep it (the output table is in out/)")
    p.add_argument("--json", dest="json_out", default=None)
    a = p.parse_args(argv)
    run_reprocess_bench(a.records, a.keys, a.partitions, a.value_size, a.json_out,
                        max_records_per_batch=a.max_records_per_batch, rules_version=a.rules,
                        malformed_share=a.malformed_share, seed=a.seed, bootstrap=a.bootstrap,
                        workdir=a.workdir, extra=a.extra, master=a.master,
                        reference_processes=a.reference_processes)


if __name__ == "__main__":
    main()
