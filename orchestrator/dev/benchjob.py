"""The reprocess step of the benchmarks: the standardize job over a whole log, in a process of its own.

`run_in_child` starts `python -m orchestrator.dev.benchjob <params.json> <result.json>`, relays
its progress lines, samples the peak resident memory of that process and its descendants (the
driver: Python, its JVM and the JVM's local Python workers; on a standalone cluster the
executors are the workers' children, not the driver's, so they are not counted), and stops what
is left of its process group by PID. A process per run gives every run a fresh JVM, so runs on
different clusters or log sizes do not share a driver's memory.

In the child, `run_job` builds the job's arguments with the runtime's own parser, starts Spark
(timed: start-up), and calls `start_standardize(ctx)`: the one place that knows how the job is
started. It starts `jobs.standardize` through kappa's runner (`jobs.lib.contract.runner.start_job`), so the benchmark measures
whatever data path the job has. The time breakdown comes from Spark's progress reports (every
job has them) and, when the job sets `ctx.stage_timings` (a list of per-batch dicts of seconds,
e.g. the BatchWriter's `timings`), from the job's own stages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from orchestrator.core.exceptions import ConfigError, LifecycleError

__all__ = ["PROGRESS", "SPARK_PHASES", "start_standardize", "spark_breakdown", "stage_totals", "run_job",
           "run_in_child", "child_env", "job_argv", "main"]

PROGRESS = "progress: "
#: Spark's micro-batch phases in the order a trigger runs them (StreamingQueryProgress.durationMs).
SPARK_PHASES = ("latestOffset", "walCommit", "getBatch", "queryPlanning", "addBatch", "commitOffsets")
#: Stage-timing keys that are not durations.
_NOT_SECONDS = {"batch_id", "rows_in", "rows_out", "entered", "left", "spark_jobs"}


def start_standardize(ctx: Any) -> Any:
    """Start the standardize query exactly as the runtime does (`jobs.lib.contract.runner.start_job` with `--rules`)."""
    from jobs import standardize
    from jobs.lib.contract.runner import start_job
    from jobs.lib.rules.files import load_rules

    return start_job(ctx, standardize.JOB, standardize.transform, load_rules(ctx.args.rules))


def job_argv(p: dict) -> list[str]:
    """The runtime's arguments for one benchmark run (an available-now reprocess from offset zero)."""
    work = Path(p["work"])
    argv = ["--pipeline", "bench", "--version", "1", "--bootstrap-servers", p["bootstrap"], "--topics", p["topic"],
            "--output", str(work / "out"), "--rejects", str(work / "out__rejects"),
            "--checkpoint", str(work / "checkpoint"), "--run-dir", str(work / "run"),
            "--group-id", f"kappa-bench-{os.getpid()}-{time.time_ns()}",
            "--rules", p["rules_file"], "--max-records-per-batch", str(p["max_records_per_batch"]),
            "--trigger", "available-now", "--master", p["master"], "--job", "jobs.standardize:transform",
            "--key", "member_id"]
    if p.get("kafka_config"):
        argv += ["--kafka-config", json.dumps(p["kafka_config"])]
    if p.get("extra"):
        argv += ["--extra", json.dumps(p["extra"])]
    return argv


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def spark_breakdown(progress: list[dict], query_start: float, query_seconds: float) -> dict[str, float]:
    """Where a query's time went, from its progress reports (`query_start` in epoch seconds).

    Sums each of Spark's phases over the batches that read something; `until_first_trigger` is
    start() to the first trigger, `first_batch_planning` the first batch's phases before its
    `addBatch` (offsets, offset log, planning), `after_last_trigger` the end of the last trigger
    to the end of the query. Other time is between triggers.
    """
    ran = [p for p in progress if (p.get("numInputRows") or 0) > 0 or "addBatch" in (p.get("durationMs") or {})]
    out: dict[str, float] = {k: 0.0 for k in SPARK_PHASES}
    out["triggers"] = 0.0
    for p in ran:
        d = p.get("durationMs") or {}
        for k in SPARK_PHASES:
            out[k] += d.get(k, 0) / 1000.0
        out["triggers"] += d.get("triggerExecution", 0) / 1000.0
    if progress:
        first, last = progress[0], progress[-1]
        out["until_first_trigger"] = max(0.0, _epoch(first["timestamp"]) - query_start)
        d0 = (ran[0] if ran else first).get("durationMs") or {}
        out["first_batch_planning"] = sum(d0.get(k, 0) for k in SPARK_PHASES[:4]) / 1000.0
        last_end = _epoch(last["timestamp"]) + (last.get("durationMs") or {}).get("triggerExecution", 0) / 1000.0
        out["after_last_trigger"] = max(0.0, query_start + query_seconds - last_end)
    out["batches"] = float(len(ran))
    return {k: round(v, 3) for k, v in out.items()}


def stage_totals(timings: list[dict] | None) -> dict[str, float]:
    """The job's own per-batch stage timings summed by stage (numbers only, not ids or clocks)."""
    totals: dict[str, float] = {}
    for t in timings or []:
        for k, v in t.items():
            if k in _NOT_SECONDS or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            totals[k] = totals.get(k, 0.0) + float(v)
    return {k: round(v, 3) for k, v in totals.items()}


def _bench_context(args, spark, status, emit: Callable[[str], None], total: int):
    from jobs.lib.runtime.context import JobContext

    class BenchContext(JobContext):
        """The runtime's context, which also reports each batch as a progress line."""

        def __init__(self) -> None:
            super().__init__(args, spark, status)
            self.started = time.perf_counter()
            self.rows_in = 0
            self.rejects_total: int | None = None
            self.batch_ids: set[int] = set()

        def record_batch(self, batch_id, rows_in, rows_out, rejects=0, rejects_total=None, timing=None) -> None:
            super().record_batch(batch_id, rows_in, rows_out, rejects, rejects_total, timing)
            self.rows_in += int(rows_in)
            self.batch_ids.add(int(batch_id))
            if rejects_total is not None:
                self.rejects_total = int(rejects_total)
            emit(f"micro-batch {batch_id}: {self.rows_in:,}/{total:,} records "
                 f"({time.perf_counter() - self.started:.1f} s since the query started)")

    return BenchContext()


def _wait_executors(spark, n: int, timeout: float = 180.0) -> int:
    """Block until `n` executors have registered with the driver (a standalone cluster)."""
    sc = spark.sparkContext
    deadline = time.monotonic() + timeout
    while True:
        have = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # the driver counts as one
        if have >= n or time.monotonic() > deadline:
            return have
        time.sleep(0.2)


def parallelism_of(spark: Any) -> int:
    return int(spark.sparkContext.defaultParallelism)


def run_job(p: dict, emit: Callable[[str], None] = print) -> dict[str, Any]:
    """One reprocess, in this process (the child's body); the figures as a dict."""
    import importlib

    importlib.import_module("jobs.standardize")  # before the clocks, as `python -m jobs.run` does
    from jobs.lib.runtime.args import parse_args
    from jobs.lib.runtime.session import build_session
    from jobs.lib.runtime.sparkwork import executor_time
    from jobs.lib.runtime.status import Status
    from orchestrator.dev.benchutil import process_cpu_seconds

    args = parse_args(job_argv(p))
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    conf = {"spark.ui.showConsoleProgress": "false", "spark.sql.streaming.numRecentProgressUpdates": "100000",
            **{k: str(v) for k, v in (p.get("spark_conf") or {}).items()}}
    spark = build_session("kappa-bench-reprocess", master=args.master, local_dir=str(Path(p["work"]) / "spark-local"),
                          extra=conf)
    try:
        executors = _wait_executors(spark, p["wait_executors"]) if p.get("wait_executors") else None
        startup = time.perf_counter() - t0
        emit(f"Spark started in {startup:.1f} s (master {args.master}"
             + (f", {executors} executors" if executors is not None else "") + ")")
        ctx = _bench_context(args, spark, Status(Path(args.run_dir) / "status.json", args.pipeline, args.version,
                                                 args.trigger), emit, int(p.get("total") or 0))
        wall0, t1 = time.time(), time.perf_counter()
        ctx.started = t1
        if p.get("pipeline") == "plain":
            from orchestrator.dev.plainspark import start_plain_query

            query = start_plain_query(spark, args.bootstrap_servers, p["topic"], args.output, args.checkpoint,
                                      {"minPartitions": str(parallelism_of(spark))})
        else:
            query = start_standardize(ctx)
        try:
            query.awaitTermination()
        finally:
            if query.isActive:
                query.stop()
        seconds = time.perf_counter() - t1
        if query.exception() is not None:
            raise LifecycleError(f"the benchmark's standardize query failed: {query.exception()}")
        progress = [json.loads(x.json) for x in query.recentProgress or []]
        parallelism = spark.sparkContext.defaultParallelism
        work = executor_time(spark, top=6)
        cpu = process_cpu_seconds()
    finally:
        spark.stop()
    breakdown = spark_breakdown(progress, wall0, seconds)
    return {"startup": round(startup, 3), "seconds": round(seconds, 3), "master": args.master,
            "executors": executors, "default_parallelism": parallelism,
            "batches": len(ctx.batch_ids) or int(breakdown["batches"]), "rows_in": ctx.rows_in,
            "rejects_reported": ctx.rejects_total, "spark": breakdown,
            "stages": stage_totals(getattr(ctx, "stage_timings", None)),
            "stages_exposed": getattr(ctx, "stage_timings", None) is not None,
            "spark_jobs": sum(int(t.get("spark_jobs", 0)) for t in getattr(ctx, "stage_timings", None) or []),
            "executor": work.as_dict() if work is not None else None, "process_cpu_seconds": cpu,
            "output": args.output, "rejects": args.rejects, "pid": os.getpid()}


def project_root() -> Path:
    import orchestrator

    return Path(orchestrator.__file__).resolve().parents[1]


def child_env(**extra: str) -> tuple[dict[str, str], str]:
    """(the environment, the working folder) of a benchmark's Spark child process: Spark's environment
    (`spark_env`), unbuffered output, the project on its path; `extra` on top."""
    from jobs.lib.runtime.session import spark_env

    root = str(project_root())
    return {**os.environ, **spark_env(), "PYTHONUNBUFFERED": "1", **extra,
            "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}, root


def run_in_child(p: dict, work: Path, console, label: str = "reprocess") -> dict[str, Any]:
    """`run_job(p)` in a child process (module docstring); its result plus `peak_memory_bytes`."""
    from orchestrator.dev.benchutil import PeakMemory
    from orchestrator.jobctl.process import end_group

    work.mkdir(parents=True, exist_ok=True)
    pfile, rfile, log = work / f"{label}.params.json", work / f"{label}.result.json", work / f"{label}.log"
    pfile.write_text(json.dumps(p), encoding="utf-8")
    rfile.unlink(missing_ok=True)
    env, root = child_env()
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator.dev.benchjob", str(pfile), str(rfile)],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=root,
                                start_new_session=True)
    mem = PeakMemory(proc.pid).start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(PROGRESS):
                console.print("  " + line[len(PROGRESS):].rstrip(), highlight=False, markup=False)
        proc.wait()
    finally:
        peak = mem.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        end_group(proc.pid, 10.0)  # the child's JVM and Python workers, if any outlived it
    result = json.loads(rfile.read_text(encoding="utf-8")) if rfile.exists() else {}
    if proc.returncode != 0 or "error" in result or not result:
        why = result.get("error") or " | ".join(log.read_text(errors="replace").strip().splitlines()[-8:])[-1500:]
        raise LifecycleError(f"the benchmark's reprocess ({label}) failed with exit {proc.returncode}: {why} "
                             f"(its log: {log}; keep it with --workdir)")
    result["peak_memory_bytes"] = peak
    result["child_pid"] = proc.pid
    return result


def main(argv: list[str] | None = None) -> int:
    """`python -m orchestrator.dev.benchjob PARAMS_JSON RESULT_JSON` (run by `run_in_child`)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        raise ConfigError("usage: python -m orchestrator.dev.benchjob PARAMS_JSON RESULT_JSON")
    p = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        result = run_job(p, emit=lambda s: print(PROGRESS + s, flush=True))
    except Exception as e:  # noqa: BLE001 - the parent raises it, with the log's path
        import traceback

        traceback.print_exc()
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        result, code = {"error": f"{type(e).__name__}: {' '.join(lines[:3])[:1000]}"}, 1
    else:
        code = 0
    Path(argv[1]).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main())
