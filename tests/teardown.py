"""A test module's end: its version jobs killed, not stopped gracefully.

Once every assertion has run, nothing looks at a job again and its folders are thrown away, so a
graceful stop (the batch in flight, then Spark's own shutdown, a few seconds a job) only costs time.
Each job's process group is killed by the PID kappa recorded, its ownership checked
(`inspect_version(...).alive`); the registry is left as it is."""

from __future__ import annotations

import signal
from typing import Any, Iterable

__all__ = ["kill_jobs"]


def kill_jobs(k: Any, pipelines: Iterable[str]) -> list[str]:
    """SIGKILL the job of every version of `pipelines` that runs; which ones (``name vN (pid P)``)."""
    from orchestrator.jobctl import inspect_version
    from orchestrator.jobctl.process import end_group, signal_group

    killed = []
    for name in pipelines:
        for rec in k.registry.list_versions(name):
            st = inspect_version(k.version(name, rec.version))
            if st.alive and st.pid:
                signal_group(st.pid, signal.SIGKILL)
                end_group(st.pid, 5.0)
                killed.append(f"{name} v{rec.version} (pid {st.pid})")
    return killed
