"""Flip latency: how long an alias flip (registry compare-and-swap + pointer publish) takes while
readers keep resolving the alias and reading the table it points at.

The benchmark flips a pipeline's alias back and forth between two versions that have tables
(by default the one it serves and its previous one) `flips` times with the same calls a promote
makes (`Registry.flip_alias`, then `serving.publish_current`), while `readers` reader processes
(`python -m orchestrator.dev.flipbench --reader ...`, the default) or threads loop: resolve the
alias from the pointer file, open the Delta table, read its key column. Flipping starts once
every reader has read once. Any exception in a reader is a reader error (the goal is none:
readers never see a half-switched alias). The alias ends where it started, so version states
are untouched; the flips are in the alias history, and one audit entry holds the figures
(p50_ms, p99_ms, max_ms, mean_ms, reads, reads_by_version, reader_errors, goal_met, ...).

With `record_dir`, every reader also writes down each read as it happened, one JSON line per
read in `<record_dir>/reader-<i>.jsonl`: {"pointer": the pointer file's text as read (null if it
could not be read), "rows": rows read from the table it named (null on failure), "error": null or
"Type: message"}. That lets a check from outside (the tests) judge what readers saw, instead of
trusting the benchmark's own error counter.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.core.exceptions import ConfigError, NotFoundError, NotReadyError
from orchestrator.core import uris
from orchestrator.core.paths import alias_pointer_path as pointer_path
from orchestrator.serving import publish_current

__all__ = ["flip_benchmark"]


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def _read_loop(warehouse: str, alias: str, column: str | None, should_stop, on_first_read=None,
               record: str | None = None) -> dict[str, Any]:
    """One reader: resolve, open, read, until `should_stop()`; returns reads, errors and versions seen.

    `record`: a file to write each read down in (module docstring), line by line as it happens.
    """
    from orchestrator.core.tables import read_table

    path = pointer_path(warehouse, alias)
    reads = errors = 0
    samples: list[str] = []
    seen: dict[str, int] = {}
    out = open(record, "a", encoding="utf-8", buffering=1) if record else None
    try:
        while not should_stop():
            text = rows = error = None
            try:
                text = uris.read_text(path)
                if text is None:
                    raise FileNotFoundError(f"pointer {path} missing")
                pointer = json.loads(text)
                rows = read_table(pointer["table"], [column] if column else None).num_rows
                reads += 1
                seen[str(pointer["version"])] = seen.get(str(pointer["version"]), 0) + 1
                if reads == 1 and on_first_read is not None:
                    on_first_read()
            except Exception as e:  # every failure is a reader error
                errors += 1
                error = f"{type(e).__name__}: {e}"
                if len(samples) < 5:
                    samples.append(error)
            if out is not None:
                out.write(json.dumps({"pointer": text, "rows": rows, "error": error}) + "\n")
    finally:
        if out is not None:
            out.close()
    return {"reads": reads, "errors": errors, "samples": samples, "seen": seen}


def _reader_process_main(argv: list[str]) -> None:
    """`python -m orchestrator.dev.flipbench --reader WAREHOUSE ALIAS COLUMN CONTROL_DIR INDEX RECORD`."""
    warehouse, alias, column, control, index, record = argv
    ctl = Path(control)
    result = _read_loop(warehouse, alias, column or None, lambda: (ctl / "stop").exists(),
                        lambda: (ctl / f"ready.{index}").touch(), record or None)
    print(json.dumps(result), flush=True)
    # delta-rs' runtime threads can abort the interpreter's shutdown ("terminate called without an
    # active exception"); the result is out, so leave without it.
    os._exit(0)


def flip_benchmark(k, pipeline: str, *, versions: tuple[int, int] | None = None, flips: int = 100,
                   readers: int = 4, reader_mode: str = "process", actor: str = "flipbench",
                   warmup_seconds: float = 0.5, record_dir: str | Path | None = None) -> dict[str, Any]:
    """Flip the alias `flips` times under `readers` concurrent readers; latency percentiles in ms.

    `record_dir`: where readers write down each read (module docstring).
    """
    from deltalake import DeltaTable

    if reader_mode not in ("process", "thread"):
        raise ConfigError(f"reader_mode must be 'process' or 'thread', not {reader_mode!r}")
    if flips < 1 or readers < 0:
        raise ConfigError("flips must be >= 1 and readers >= 0")
    spec = k.pipeline(pipeline)
    reg = k.registry
    rec = reg.get_alias(spec.alias)
    if rec is None:
        raise NotFoundError(f"alias {spec.alias!r} serves nothing yet; promote a version of {pipeline} first")
    if versions is None:
        if rec.previous_version is None:
            raise NotReadyError(f"the flip benchmark needs two versions of {pipeline} with tables; alias "
                                f"{spec.alias!r} has no previous version (pass versions=(a, b))")
        versions = (rec.version, rec.previous_version)
    a, b = versions
    if rec.version not in versions:
        raise NotReadyError(f"alias {spec.alias!r} serves v{rec.version}, which is not one of {versions}")
    for v in k.versions(spec, list(versions)):
        if not DeltaTable.is_deltatable(str(v.paths.table)):
            raise NotReadyError(f"{v} has no table at {v.paths.table}")
    publish_current(k, spec.alias)
    start_version = rec.version
    column = spec.key_columns[0]
    warehouse = str(k.settings.warehouse)

    control = Path(tempfile.mkdtemp(prefix="kappa-flipbench-"))
    if record_dir is not None:
        Path(record_dir).mkdir(parents=True, exist_ok=True)

    def record(i: int) -> str:
        return str(Path(record_dir) / f"reader-{i}.jsonl") if record_dir is not None else ""

    results: list[dict[str, Any]] = []
    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []
    stop = threading.Event()
    if reader_mode == "process":
        procs = [subprocess.Popen([sys.executable, "-m", "orchestrator.dev.flipbench", "--reader", warehouse, spec.alias,
                                   column, str(control), str(i), record(i)], stdout=subprocess.PIPE, text=True)
                 for i in range(readers)]
    else:
        def run(i: int) -> None:
            results.append(_read_loop(warehouse, spec.alias, column, stop.is_set,
                                      lambda: (control / f"ready.{i}").touch(), record(i) or None))

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(readers)]
        for t in threads:
            t.start()
    latencies: list[float] = []
    current = start_version
    t_start, cpu0 = time.perf_counter(), time.process_time()
    try:
        deadline = time.monotonic() + 120
        while len(list(control.glob("ready.*"))) < readers:   # every reader is reading before the first flip
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise NotReadyError(f"the flip benchmark's {readers} readers did not all start reading "
                                    f"{spec.alias!r} within 120 s")
            time.sleep(0.05)
        time.sleep(warmup_seconds)
        t_start, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(flips):
            target = b if current == a else a
            t0 = time.perf_counter()
            reg.flip_alias(spec.alias, pipeline, expected_version=current, new_version=target, actor=actor,
                           reason="flip latency benchmark", audit=False)
            publish_current(k, spec.alias)
            latencies.append((time.perf_counter() - t0) * 1000)
            current = target
    finally:
        elapsed = time.perf_counter() - t_start
        cpu = time.process_time() - cpu0
        if current != start_version:
            reg.flip_alias(spec.alias, pipeline, expected_version=current, new_version=start_version,
                           actor=actor, reason="flip latency benchmark: back to the start", audit=False)
            publish_current(k, spec.alias)
        (control / "stop").touch()
        stop.set()
        for t in threads:
            t.join(60)
        for p in procs:
            out, _ = p.communicate(timeout=60)
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            results.append(json.loads(lines[-1]) if lines else
                           {"reads": 0, "errors": 1, "samples": [f"reader process exited with {p.returncode}"],
                            "seen": {}})
        shutil.rmtree(control, ignore_errors=True)
    reads = sum(r["reads"] for r in results)
    errors = sum(r["errors"] for r in results)
    samples = [x for r in results for x in r["samples"]][:5]
    seen: dict[str, int] = {}
    for r in results:
        for v, n in r["seen"].items():
            seen[v] = seen.get(v, 0) + n
    figures = {
        "pipeline": pipeline, "alias": spec.alias, "versions": [a, b], "flips": flips,
        "registry": reg.dialect if hasattr(reg, "dialect") else None,
        "p50_ms": round(_percentile(latencies, 50), 3), "p99_ms": round(_percentile(latencies, 99), 3),
        "max_ms": round(max(latencies), 3), "mean_ms": round(statistics.fmean(latencies), 3),
        "readers": readers, "reader_mode": reader_mode, "reads": reads, "reads_by_version": seen,
        "reader_errors": errors, "reader_error_samples": samples, "seconds": round(elapsed, 3),
        "flipper_cpu_seconds": round(cpu, 3),
        "goal": {"p99_ms_under": 20, "reader_errors": 0},
    }
    figures["goal_met"] = figures["p99_ms"] < 20 and errors == 0
    reg.audit("flipbench", actor=actor, pipeline=pipeline, reason="flip latency benchmark",
              details={k_: v for k_, v in figures.items() if k_ != "reader_error_samples"})
    return figures


if __name__ == "__main__" and sys.argv[1:2] == ["--reader"]:
    _reader_process_main(sys.argv[2:])
