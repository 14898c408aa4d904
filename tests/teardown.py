"""A test module's end: its version jobs killed, not stopped gracefully.

Once every assertion has run, nothing looks at a job again and its folders are thrown away, so a
graceful stop (the batch in flight, then Spark's own shutdown, a few seconds a job) only costs time.
Each job's process group is killed by the PID kappa recorded, its ownership checked
(`inspect_version(...).alive`); the registry is left as it is."""

from __future__ import annotations

import signal
import time
from typing import Any, Iterable

__all__ = ["kill_jobs"]


def kill_jobs(k: Any, pipelines: Iterable[str]) -> list[str]:
    """SIGKILL the job of every version of `pipelines` that runs; which ones (``name vN (pid P)``)."""
    from orchestrator.jobctl import inspect_version
    from orchestrator.jobctl.health import CHILDREN
    from orchestrator.jobctl.process import group_alive, signal_group

    killed = []
    for name in pipelines:
        for rec in k.registry.list_versions(name):
            st = inspect_version(k.version(name, rec.version))
            if st.alive and st.pid:
                signal_group(st.pid, signal.SIGKILL)
                killed.append(f"{name} v{rec.version} (pid {st.pid})")
                child = CHILDREN.pop(st.pid, None)     # started by this process: reaped here, or it stays a zombie
                if child is not None:
                    child.wait(10)
                deadline = time.monotonic() + 10
                while group_alive(st.pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
    return killed
