"""What the Spark work of a job cost: executor CPU and run time, GC, per stage, from Spark's status store.

Spark's listener bus feeds the application status store (the data behind its UI and REST API) whether
or not the UI runs; `executor_time` reads the completed stages from it, so a job, a benchmark or a
test can report the executor CPU seconds beside the wall time. On a busy machine wall time stretches
several-fold while CPU seconds hardly move, so the two together say whether a run was slow or only
starved. Stages the store has evicted (``spark.ui.retainedStages``, 1000 by default) are not counted:
read it often enough or raise that setting for long runs. A job in a process of its own (a version's
job that a benchmark deployed) writes Spark's event log instead (`KAPPA_SPARK_EVENT_LOG_DIR`), and
`event_log_time` sums its tasks' metrics.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["StageTime", "ExecutorTime", "executor_time", "event_log_time", "event_log_jobs"]


@dataclass(frozen=True)
class StageTime:
    stage_id: int
    name: str
    tasks: int
    run_seconds: float
    cpu_seconds: float


@dataclass(frozen=True)
class ExecutorTime:
    """Totals over the completed stages (seconds), and the costliest stages by executor run time."""

    cpu_seconds: float = 0.0
    run_seconds: float = 0.0
    gc_seconds: float = 0.0
    stages: int = 0
    top: list[StageTime] = field(default_factory=list)

    def since(self, earlier: "ExecutorTime") -> "ExecutorTime":
        """What was spent after `earlier` was read (totals only)."""
        return ExecutorTime(cpu_seconds=round(self.cpu_seconds - earlier.cpu_seconds, 3),
                            run_seconds=round(self.run_seconds - earlier.run_seconds, 3),
                            gc_seconds=round(self.gc_seconds - earlier.gc_seconds, 3),
                            stages=self.stages - earlier.stages)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def executor_time(spark: Any, top: int = 0, wait_seconds: float = 5.0) -> ExecutorTime | None:
    """Executor time of every completed stage of `spark`'s application (after the listener bus has
    delivered what is queued, at most `wait_seconds`); None when the store cannot be read."""
    try:
        sc = spark.sparkContext._jsc.sc()
        sc.listenerBus().waitUntilEmpty(int(wait_seconds * 1000))
        gateway = spark.sparkContext._gateway
        complete = gateway.jvm.org.apache.spark.status.api.v1.StageStatus.COMPLETE
        statuses = gateway.jvm.java.util.ArrayList()
        statuses.add(complete)
        stages = sc.statusStore().stageList(statuses, False, False, gateway.new_array(gateway.jvm.double, 0), None)
        it = stages.iterator()
        cpu = run = gc = 0
        n = 0
        rows: list[StageTime] = []
        while it.hasNext():
            s = it.next()
            n += 1
            cpu += s.executorCpuTime()
            run += s.executorRunTime()
            gc += s.jvmGcTime()
            if top:
                rows.append(StageTime(int(s.stageId()), str(s.name()), int(s.numTasks()),
                                      round(s.executorRunTime() / 1e3, 3), round(s.executorCpuTime() / 1e9, 3)))
    except Exception:  # noqa: BLE001 - a figure, never a failure
        return None
    rows.sort(key=lambda r: -r.run_seconds)
    return ExecutorTime(cpu_seconds=round(cpu / 1e9, 3), run_seconds=round(run / 1e3, 3),
                        gc_seconds=round(gc / 1e3, 3), stages=n, top=rows[:top])


#: Codecs Spark may compress an event log with (its file name ends with one, then maybe ".inprogress").
_COMPRESSED = (".zstd", ".lz4", ".lzf", ".snappy")


def _app_name(path: Path, folder: Path) -> str:
    """One application's name: its file (v1 layout) or its folder of rolled files (v2, `eventlog_v2_<app>`)."""
    rel = path.relative_to(folder)
    return rel.parts[0].removesuffix(".inprogress")


def _events(folder: str | Path, kinds: tuple[str, ...]):
    import json

    folder = Path(folder)
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.name.startswith("appstatus_"):
            continue
        if path.name.removesuffix(".inprogress").endswith(_COMPRESSED):
            raise ValueError(f"Spark event log {path} is compressed, and the benchmarks read it as text: run the job "
                             f"with spark.eventLog.compress=false (kappa's sessions set it)")
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not any(f'"{k}"' in line for k in kinds):
                    continue
                try:
                    yield _app_name(path, folder), json.loads(line)
                except ValueError:
                    continue          # the last line of a log still being written


def event_log_time(folder: str | Path, since: float | None = None) -> ExecutorTime:
    """Executor time of the tasks in the Spark event logs under `folder` (finished or still being
    written: a run in progress counts what it has flushed), of those that ended after `since` (epoch
    seconds) if given."""
    cpu = run = gc = 0
    stages: set[tuple[str, int]] = set()
    for name, event in _events(folder, ("SparkListenerTaskEnd",)):
        if since is not None and (event.get("Task Info") or {}).get("Finish Time", 0) / 1000.0 < since:
            continue
        m = event.get("Task Metrics") or {}
        cpu += int(m.get("Executor CPU Time") or 0)
        run += int(m.get("Executor Run Time") or 0)
        gc += int(m.get("JVM GC Time") or 0)
        stages.add((name, int(event.get("Stage ID", -1))))
    return ExecutorTime(cpu_seconds=round(cpu / 1e9, 3), run_seconds=round(run / 1e3, 3),
                        gc_seconds=round(gc / 1e3, 3), stages=len(stages))


def event_log_jobs(folder: str | Path, since: float | None = None) -> dict[str, int]:
    """Spark jobs per job group in the event logs under `folder` (a kappa micro-batch runs as the group
    ``kappa-<app id>-batch-<id>``), of those submitted after `since` (epoch seconds) if given."""
    jobs: dict[str, int] = {}
    for _, event in _events(folder, ("SparkListenerJobStart",)):
        if since is not None and event.get("Submission Time", 0) / 1000.0 < since:
            continue
        group = (event.get("Properties") or {}).get("spark.jobGroup.id")
        if group:
            jobs[group] = jobs.get(group, 0) + 1
    return jobs
