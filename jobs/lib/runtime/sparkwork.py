"""What the Spark work of a job cost: executor CPU and run time, GC, per stage, from Spark's status store.

Spark's listener bus feeds the application status store (the data behind its UI and REST API) whether
or not the UI runs; `executor_time` reads the completed stages from it, so a job, a benchmark or a
test can report the executor CPU seconds beside the wall time. On a busy machine wall time stretches
several-fold while CPU seconds hardly move, so the two together say whether a run was slow or only
starved. Stages the store has evicted (``spark.ui.retainedStages``, 1000 by default) are not counted:
read it often enough (every micro-batch does) or raise that setting for long runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["StageTime", "ExecutorTime", "executor_time"]


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
