"""`kappa bench cluster`: does a reprocess scale with a Spark cluster, and does the driver stay small?

On this machine: an embedded broker with one profiles topic per log size, and a Spark standalone
cluster from the pip wheel (`orchestrator.dev.sparkcluster`). The same reprocess as `kappa bench
reprocess` (`orchestrator.dev.benchjob`: the job's `build(ctx)`, available-now from offset zero,
each run in a process of its own with a fresh table and checkpoint) runs first on 1 worker of 1
core, then on 2 workers of 1 core each (`spark.cores.max`), for every size. Figures: records/s
per run (excluding Spark start-up, which includes waiting for the executors to register), the
throughput ratio 2 workers / 1 worker per size (the goal is at least 1.7), and the driver's peak
memory: the resident memory of the driver's Python process, its JVM and the JVM's Python children,
not the workers or executors (which are the workers' children). Each run's output is checked as
`kappa bench reprocess` checks it. Everything started is stopped by its own PID.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator.core.exceptions import BrokerError, ConfigError
from orchestrator.dev.benchutil import rate, ratio, write_figures

__all__ = ["WORKER_STEPS", "GOAL", "validate_cluster", "scaling_rows", "cluster_lines", "run_cluster_bench"]

WORKER_STEPS = (1, 2)
GOAL = 1.7


def validate_cluster(sizes: list[int], partitions: int, max_records_per_batch: int, value_size: int) -> None:
    """ConfigError (one line, naming the option) for settings the benchmark cannot run with."""
    if not sizes:
        raise ConfigError("--sizes names no log size: write e.g. 1M,4M")
    if partitions < 2:
        raise ConfigError(f"--partitions must be at least 2 (one per worker), got {partitions}")
    if max_records_per_batch < 1:
        raise ConfigError(f"--max-records-per-batch must be at least 1, got {max_records_per_batch}")
    if value_size < 50:
        raise ConfigError(f"--value-size must be at least 50 bytes, got {value_size}")


def scaling_rows(runs: list[dict]) -> list[dict[str, Any]]:
    """One row per log size from the runs ({size, workers, records_per_s, driver_peak_mb}): each
    step's throughput and driver memory, and the ratio of the last step to the first (pure: tested)."""
    rows = []
    for size in sorted({r["size"] for r in runs}):
        by = {r["workers"]: r for r in runs if r["size"] == size}
        first, last = by.get(min(by)), by.get(max(by))
        rows.append({"size": size, "records_per_s": {w: by[w]["records_per_s"] for w in sorted(by)},
                     "seconds": {w: by[w].get("seconds") for w in sorted(by)},
                     "executor_cpu_seconds": {w: by[w].get("executor_cpu_seconds") for w in sorted(by)},
                     "driver_peak_mb": {w: by[w]["driver_peak_mb"] for w in sorted(by)},
                     "ratio": ratio(last["records_per_s"], first["records_per_s"], 2) if len(by) > 1 else None})
    return rows


def cluster_lines(f: dict) -> list[str]:
    """The printed result (pure: tested)."""
    lines = []
    for row in f["scaling"]:
        rps = ", ".join(f"{w} worker{'s' if w > 1 else ''} {v:,} records/s" for w, v in row["records_per_s"].items())
        mem = ", ".join(f"{v:,} MB with {w}" for w, v in row["driver_peak_mb"].items())
        verdict = "" if row["ratio"] is None else (
            f"; ratio {row['ratio']:.2f} ({'goal met' if row['ratio'] >= GOAL else 'goal NOT met'}: >= {GOAL})")
        cpu = ", ".join(f"{row['seconds'][w]:.1f} s wall / {row['executor_cpu_seconds'][w]:.1f} s executor CPU with {w}"
                        for w in row.get("executor_cpu_seconds", {}) if row["executor_cpu_seconds"][w] is not None
                        and row["seconds"].get(w) is not None)
        lines.append(f"{row['size']:,} records: {rps}{verdict}; driver peak memory {mem}" + (f"; {cpu}" if cpu else ""))
    sizes = f["scaling"]
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        for w in hi["driver_peak_mb"]:
            if w in lo["driver_peak_mb"]:
                lines.append(f"driver peak memory with {w} worker{'s' if w > 1 else ''}: {lo['driver_peak_mb'][w]:,} MB "
                             f"at {lo['size']:,} records, {hi['driver_peak_mb'][w]:,} MB at {hi['size']:,} records "
                             f"(x{ratio(hi['driver_peak_mb'][w], lo['driver_peak_mb'][w], 2)} for "
                             f"x{ratio(hi['size'], lo['size'], 2)} the records)")
    return lines


def run_cluster_bench(sizes: list[int] | tuple[int, ...] = (1_000_000, 4_000_000), *, partitions: int = 4,
                      value_size: int = 200, max_records_per_batch: int = 500_000, rules: str = "v2",
                      seed: int = 42, worker_memory: str = "2g", executor_memory: str = "1g",
                      extra: dict | None = None, verify: bool = True, workdir: str | Path | None = None,
                      console=None, json_out=None) -> dict[str, Any]:
    """Run the cluster benchmark (module docstring); print and return its figures."""
    from rich.console import Console

    from jobs.lib.rules.files import rules_path
    from orchestrator.core.tables import count_rows, read_table
    from orchestrator.dev.bench import compare_raw, expected_raw
    from orchestrator.dev.benchjob import run_in_child
    from orchestrator.dev.broker import EmbeddedBroker
    from orchestrator.dev.datagen import ensure_topic, generate_changelog, produce
    from orchestrator.dev.sparkcluster import StandaloneCluster

    sizes = list(sizes)
    validate_cluster(sizes, partitions, max_records_per_batch, value_size)
    console = console or Console(highlight=False)
    own_dir = workdir is None
    work = Path(tempfile.mkdtemp(prefix="kappa-bench-cluster-")) if own_dir else Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {"params": {"sizes": sizes, "partitions": partitions, "value_size": value_size,
                                          "max_records_per_batch": max_records_per_batch, "rules": rules,
                                          "worker_steps": list(WORKER_STEPS), "cores_per_worker": 1,
                                          "executor_memory": executor_memory, "extra": extra or {}},
                               "runs": [], "pids_started": []}
    broker = cluster = None
    try:
        broker = EmbeddedBroker(work / "broker").start()
        figures["pids_started"].append(broker.proc.pid)
        bootstrap = broker.bootstrap_servers
        topics: dict[int, tuple[str, int]] = {}
        gen = {}
        for size in sizes:
            topic = f"bench_cluster_{size}_{time.time_ns() % 10**9}"
            gen[size] = dict(records=size, keys=max(1, size // 4), seed=seed, value_size=value_size,
                             malformed_share=0.001, delete_share=0.02)
            ensure_topic(bootstrap, topic, partitions)
            console.print(f"producing {size:,} records (~{value_size} B, {gen[size]['keys']:,} keys, {partitions} "
                          f"partitions) to {topic}...", highlight=False)
            stats = produce(bootstrap, topic, generate_changelog(**gen[size]), batching=True, partitions=partitions)
            if stats.records != size:
                raise BrokerError(f"produced {stats.records:,} of {size:,} records to {topic}")
            topics[size] = (topic, stats.bytes)
        console.print("starting a Spark standalone cluster on 127.0.0.1 (pyspark's spark-class)...")
        cluster = StandaloneCluster(work / "cluster").start()
        figures["pids_started"].append(cluster.pids[0])
        figures["master"] = cluster.url
        expected: dict[int, tuple] = {}
        for workers in WORKER_STEPS:
            while cluster.workers < workers:
                figures["pids_started"].append(cluster.add_worker(cores=1, memory=worker_memory))
            for size in sizes:
                topic, nbytes = topics[size]
                console.print(f"reprocess of {size:,} records on {workers} worker{'s' if workers > 1 else ''} of 1 "
                              f"core...", highlight=False)
                label = f"w{workers}-{size}"
                job = run_in_child({"bootstrap": bootstrap, "topic": topic, "work": str(work / label),
                                    "rules_file": str(rules_path("titles", rules)),
                                    "max_records_per_batch": max_records_per_batch, "master": cluster.url,
                                    "extra": extra or {}, "total": size, "wait_executors": workers,
                                    "spark_conf": {"spark.cores.max": workers, "spark.executor.cores": 1,
                                                   "spark.executor.memory": executor_memory}},
                                   work / label, console, label=label)
                figures["pids_started"].append(job["child_pid"])
                run = {"size": size, "workers": workers, **rate(size, nbytes, job["seconds"]),
                       "startup_seconds": job["startup"], "executors": job["executors"], "batches": job["batches"],
                       "driver_peak_mb": round(job["peak_memory_bytes"] / 1e6), "spark": job["spark"],
                       "executor_cpu_seconds": (job.get("executor") or {}).get("cpu_seconds")}
                if verify:
                    if size not in expected:
                        expected[size] = expected_raw(generate_changelog(**gen[size]))
                    run["check"] = compare_raw(read_table(job["output"]), count_rows(job["rejects"]), *expected[size])
                console.print(f"  {run['records_per_s']:,} records/s, {run['mb_per_s']:.1f} MB/s in "
                              f"{run['seconds']:.1f} s (start-up {job['startup']:.1f} s; executor CPU "
                              f"{run['executor_cpu_seconds'] or 0:.1f} s); driver peak "
                              f"{run['driver_peak_mb']:,} MB"
                              + ("" if not verify else f"; output {'matches' if run['check']['raw_columns_match'] and run['check']['rejects_match'] else 'DOES NOT match'}"),
                              highlight=False)
                figures["runs"].append(run)
                shutil.rmtree(work / label / "out", ignore_errors=True)
                shutil.rmtree(work / label / "checkpoint", ignore_errors=True)
        figures["scaling"] = scaling_rows(figures["runs"])
    finally:
        if cluster is not None:
            for what, pid in cluster.stop():
                console.print(f"stopped Spark {what} (pid {pid})", highlight=False)
        if broker is not None:
            pid = broker.proc.pid if broker.proc is not None else None
            broker.stop()
            console.print(f"stopped the broker (pid {pid})", highlight=False)
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)
    for line in cluster_lines(figures):
        console.print(line, highlight=False)
    write_figures(json_out, figures)
    return figures
