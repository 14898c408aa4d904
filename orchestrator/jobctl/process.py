"""Is a recorded process still ours, and how to stop it: the one place kappa checks a PID.

kappa records the PID of every process it starts (jobs, the broker, Airflow's parts) together with
the process's creation time as the kernel reports it (`create_time`). A PID whose process is gone,
is a zombie, or now belongs to another process (its creation time differs by more than
`CREATE_TIME_TOLERANCE`) is not ours: kappa never signals it.
"""

from __future__ import annotations

import os
import signal
import time

import psutil

from orchestrator.core.envvars import KAPPA_LAUNCH_ID

__all__ = ["CREATE_TIME_TOLERANCE", "LAUNCH_ENV", "create_time", "find_launched", "is_ours", "wait_gone", "group_alive", "group_running",
           "wait_group_ended", "signal_group", "stop_process", "stop_group", "end_group"]

#: Seconds two readings of one process's creation time may differ by (the kernel's clock ticks and
#: boot-time rounding); a reused PID started later than that.
CREATE_TIME_TOLERANCE = 1.0


#: The environment variable that carries a job's launch id (a random token, no secret) into every
#: process of the job, so a job whose starter died before recording its PID can still be found.
LAUNCH_ENV = KAPPA_LAUNCH_ID


def find_launched(launch_id: str) -> tuple[int, float] | None:
    """(pid, creation time) of the live process that leads the session started with `launch_id`.

    The job's processes inherit the id in their environment; the one kappa spawned leads its
    own session (pid == sid), its children (JVM, Python workers) do not. None if none runs.
    Only processes of this user can be read, and only those are ever kappa's.
    """
    if not launch_id:
        return None
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) != proc.pid or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(LAUNCH_ENV) == launch_id:
                return proc.pid, proc.create_time()
        except (psutil.Error, OSError):
            continue
    return None


def create_time(pid: int | None) -> float | None:
    """When the live process `pid` was created (epoch seconds); None if it is gone or a zombie."""
    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except psutil.Error:
        return None


def is_ours(pid: int | None, created: float | None, *, tolerance: float = CREATE_TIME_TOLERANCE) -> bool:
    """Whether `pid` runs and is the process created at `created` (None: any live process `pid`)."""
    actual = create_time(pid)
    if actual is None:
        return False
    return created is None or abs(actual - created) <= tolerance


def wait_gone(pid: int, created: float | None, timeout: float, *, poll: float = 0.1,
              tolerance: float = CREATE_TIME_TOLERANCE) -> bool:
    """Wait until `pid` is no longer our process; True if it went within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while is_ours(pid, created, tolerance=tolerance):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True


def group_alive(pgid: int) -> bool:
    """Whether any process of the process group `pgid` is left (zombies included)."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def group_running(pgid: int) -> bool:
    """Whether a process of the group `pgid` still runs: zombies run nothing (an orphan's is init's to reap)."""
    if not group_alive(pgid):
        return False
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def wait_group_ended(pgid: int, timeout: float, *, poll: float = 0.1) -> bool:
    """Wait until no process of the group `pgid` runs (`group_running`); True if none did within `timeout`."""
    deadline = time.monotonic() + timeout
    while group_running(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True


def signal_group(pid: int, sig: int) -> None:
    """Send `sig` to the process group led by `pid` (to `pid` alone where the group is not ours)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_process(pid: int, created: float | None, timeout: float = 10.0, *,
                 tolerance: float = CREATE_TIME_TOLERANCE) -> bool:
    """SIGTERM `pid`, then SIGKILL it after `timeout` seconds, if it is still ours.

    True if it was ours (and is now gone), False if there was nothing of ours to stop.
    """
    if not is_ours(pid, created, tolerance=tolerance):
        return False
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    except psutil.NoSuchProcess:
        pass
    return True


def stop_group(pid: int, created: float | None, timeout: float = 10.0, *,
               tolerance: float = CREATE_TIME_TOLERANCE) -> bool:
    """SIGTERM the process group led by `pid`, SIGKILL what is left of it after `timeout` seconds.

    Only if `pid` is still ours; True if it was. Stragglers of the group (Spark's workers, task
    supervisors) are killed with it.
    """
    if not is_ours(pid, created, tolerance=tolerance):
        return False
    signal_group(pid, signal.SIGTERM)
    if not wait_gone(pid, created, timeout, tolerance=tolerance):
        signal_group(pid, signal.SIGKILL)
        wait_gone(pid, created, 5.0, tolerance=tolerance)
    elif group_alive(pid):
        signal_group(pid, signal.SIGKILL)
    return True


def end_group(pgid: int, timeout: float = 10.0, *, poll: float = 0.2) -> bool:
    """SIGTERM what is left of the process group `pgid`, SIGKILL it if anything outlives `timeout`.

    For the stragglers of a group whose leader kappa has already stopped through its own
    ownership check (a job's JVM and Python workers): they are known by the group id, the
    leader's PID. True if the group is gone afterwards.
    """
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        if not group_alive(pgid):
            return True
        signal_group(pgid, sig)
        deadline = time.monotonic() + wait
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(poll)
    return not group_alive(pgid)
