"""A running job's share of this machine: the nice value of every thread of its processes.

Linux keeps a nice value per thread (`setpriority(PRIO_PROCESS, tid, n)`), and a thread starts
with its creator's value, so kappa sets it on every thread of every process of the job: the
process kappa started, all its descendants (the JVM, Spark's Python workers), and any other
process on this host that carries the job's launch id in its environment (`LAUNCH_ENV`): on a
Spark standalone cluster, the executors of the job on this host get it through
`spark.executorEnv` (see `orchestrator.jobctl.launch`). Executors on other hosts are out of reach.
Threads created after a pass inherit their creator's value; the next pass sets the rest.

Lowering priority (a higher nice value) is always allowed; raising it back needs CAP_SYS_NICE
(root, or `ulimit -e`). When it is refused the result says so (`refused`), once per process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from typing import TYPE_CHECKING

import psutil

from orchestrator.core.shares import share_to_nice
from orchestrator.jobctl.health import job_alive, read_launch
from orchestrator.jobctl.process import LAUNCH_ENV

if TYPE_CHECKING:
    from orchestrator.context import VersionRef

__all__ = ["ReniceResult", "apply_share", "job_processes", "renice_processes", "thread_nice"]


@dataclass
class ReniceResult:
    """What one application of a nice value did."""

    nice: int
    processes: list[int] = field(default_factory=list)   # PIDs reached
    threads: int = 0                                      # threads set (or already at the value)
    refused: list[int] = field(default_factory=list)      # PIDs whose threads could not be raised back
    errors: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return bool(self.processes) and not self.refused and not self.errors


def job_processes(pid: int | None, launch_id: str | None = None) -> list[int]:
    """The job's processes on this host: `pid` and its descendants, and (with `launch_id`) every
    process whose environment carries it; sorted, each once. Processes of other users that cannot
    be read are not kappa's and are skipped."""
    found: set[int] = set()
    if pid:
        try:
            root = psutil.Process(pid)
            found.add(pid)
            found.update(c.pid for c in root.children(recursive=True))
        except psutil.Error:
            pass
    if launch_id:
        for proc in psutil.process_iter(["pid"]):
            if proc.pid in found:
                continue
            try:
                if proc.environ().get(LAUNCH_ENV) == launch_id:
                    found.add(proc.pid)
                    found.update(c.pid for c in proc.children(recursive=True))
            except (psutil.Error, OSError):
                continue
    return sorted(found)


def _tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def thread_nice(tid: int) -> int | None:
    """The nice value of thread `tid` (field 19 of /proc/<tid>/stat); None if it is gone."""
    try:
        stat = Path(f"/proc/{tid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[16])


def renice_processes(pids: list[int], nice: int) -> ReniceResult:
    """Set every thread of `pids` to `nice` (0..19); threads that vanish meanwhile are skipped."""
    res = ReniceResult(nice=nice)
    for pid in pids:
        tids = _tids(pid)
        if not tids:
            continue
        res.processes.append(pid)
        for tid in tids:
            try:
                if os.getpriority(os.PRIO_PROCESS, tid) != nice:
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
                res.threads += 1
            except ProcessLookupError:
                continue
            except PermissionError:
                if pid not in res.refused:
                    res.refused.append(pid)
            except OSError as e:
                res.errors.append(f"thread {tid} of pid {pid}: {e.strerror or e}")
    return res


def apply_share(v: VersionRef, share: float) -> ReniceResult:
    """Give the running job of `v` the share `share` of this machine: the nice value of
    `orchestrator.core.shares.share_to_nice` on every thread of its processes here (see the module).

    The one function that applies a share to a running version; idempotent (a pass calls it every
    time, for the threads created since). Nothing is touched when the recorded PID is no longer the
    job kappa started (`ReniceResult.processes` empty, and an error saying so)."""
    nice = share_to_nice(share)
    launch = read_launch(v) or {}
    pid = v.record.pid or launch.get("pid")
    alive, _ = job_alive(pid, launch)
    if not alive:
        return ReniceResult(nice=nice, errors=[f"{v} has no running job here (pid {pid or 'none'})"])
    if pid == os.getpid():  # a recorded PID that is this very process is no job of kappa's to slow down
        return ReniceResult(nice=nice, errors=[f"{v}'s recorded pid {pid} is this process, not its job"])
    return renice_processes(job_processes(pid, launch.get("launch_id")), nice)
