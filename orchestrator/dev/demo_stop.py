"""The end of `kappa demo` and `kappa up`: stop the jobs they know of, by the PIDs kappa records now,
and check that nothing they started is left running.

A version's job may have been stopped and started again meanwhile, by this process or another
(Airflow's monitor stops a standby after its grace period, a rollback restarts it), under a new
PID: the PID a version had at its deploy says nothing about what runs at the end. The registry and
launch.json do. A job this process spawned and another process stopped is a zombie until it is
reaped; it runs nothing, so the final check does not count it, and the cleanup reaps it first.
"""

from __future__ import annotations

import os
from typing import Callable

import psutil
from rich.console import Console

from orchestrator.core.exceptions import KappaError
from orchestrator.jobctl.process import end_group, group_alive

__all__ = ["stop_version_jobs", "still_running", "report_stopped"]


def stop_version_jobs(k, pipeline: str, *, actor: str, reason: str, job_pids: dict[int, int],
                      earlier_pids: dict[int, list[int]], done: set[int],
                      say: Callable[[str], None]) -> list[tuple[str, int]]:
    """Stop the job of every version of `pipeline` that runs now: all asked first, then each waited for.

    `job_pids` (version -> the PID last known) is brought up to date from the registry and each
    version's launch.json; a PID it replaces goes to `earlier_pids`. A version whose job is not
    running is said so (by whom it was stopped), once, and is not in the result. `done` holds the
    PIDs already dealt with, so a second call stops only what was started since. Returns
    (what, pid) of each job stopped, with the PID actually stopped.
    """
    from orchestrator.jobctl import inspect_version
    from orchestrator.jobctl.launch import reap_children
    from orchestrator.jobctl.stop import finish_stop, request_stop

    reap_children()
    try:
        refs = {v.version: v for v in k.versions(pipeline)}
    except KappaError:
        refs = {}
    versions = {n: v.record.pid for n, v in refs.items()}
    requests, quiet = {}, []
    for version in sorted(set(versions) | set(job_pids)):
        try:
            st = inspect_version(refs[version]) if version in refs else None
        except KappaError as e:
            st = None
            say(f"[red]could not read the job of {pipeline} v{version} ({e})[/]")
        current = (st.pid if st is not None else None) or versions.get(version)
        if current and job_pids.get(version) not in (None, current):
            earlier_pids.setdefault(version, []).append(job_pids[version])
        if current:
            job_pids[version] = current
        pid = job_pids.get(version)
        if pid is None or pid in done:
            continue
        if st is not None and not st.alive:
            quiet.append(version)
            continue
        requests[version] = None
        try:
            if st is not None:
                requests[version] = request_stop(refs[version], actor=actor, reason=reason, force=True,
                                                 bound=30.0)
        except KappaError as e:
            say(f"[red]could not stop {pipeline} v{version} through kappa ({e}); killing it[/]")
    stopped = []
    for version, req in requests.items():
        pid = job_pids[version]
        try:
            if req is not None:
                pid = finish_stop(req).pid or pid
        except KappaError as e:
            say(f"[red]could not stop {pipeline} v{version} through kappa ({e}); killing it[/]")
        end_group(pid, 10.0)
        stopped.append((f"{pipeline} v{version} job", pid))
        done.add(pid)
    for version in quiet:
        by = _stopped_by(k, pipeline, version)
        say(f"{pipeline} v{version}: no job running" + (f" (stopped earlier by {by})" if by else ""))
        done.add(job_pids[version])
    for pids in earlier_pids.values():   # a job stopped elsewhere may have left its JVM or workers
        for pid in pids:
            if not _leader_exists(pid) and group_alive(pid):
                end_group(pid, 10.0)
    reap_children()
    return stopped


def _stopped_by(k, pipeline: str, version: int) -> str | None:
    try:
        entries = k.registry.audit_log(pipeline, limit=1, version=version, action="stop")
    except KappaError:
        return None
    return entries[-1].actor if entries else None


def _leader_exists(pid: int) -> bool:
    try:
        psutil.Process(pid)
        return True
    except psutil.Error:
        return False


def still_running(pid: int) -> bool:
    """Whether `pid`, or a process of the group it leads, still runs. A zombie (ended, not yet reaped
    by its parent) runs nothing and holds nothing but its PID: it does not count."""
    try:
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return True
    except psutil.Error:
        pass
    if not group_alive(pid):
        return False
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            continue
    return False


def report_stopped(console: Console, stopped: list[tuple[str, int]], earlier: list[tuple[str, int]] = ()) -> bool:
    """Print what was stopped and whether anything is left running (also of `earlier`, the jobs'
    PIDs replaced by a restart); True if something is."""
    for what, pid in stopped:
        console.print(f"stopped {what} (pid {pid})", highlight=False)
    checked = [(w, p) for w, p in [*stopped, *earlier] if p]
    left = [(w, p) for w, p in checked if still_running(p)]
    if left:
        console.print(f"[red]still running: {', '.join(f'{w} (pid {p})' for w, p in left)}[/]")
    else:
        console.print(f"nothing left running (checked pids: {', '.join(str(p) for _, p in checked) or 'none'})",
                      highlight=False)
    return bool(left)
