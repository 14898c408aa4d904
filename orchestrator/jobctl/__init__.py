"""Job control: start, stop, restart and inspect the Spark job of one version.

`launch` builds the command line and environment and spawns the job, `health` reads what the
job is doing (its process and its status.json), `stop` ends it gracefully first. `process` is the
one place kappa decides whether a recorded PID is still the process it started.
"""

from orchestrator.jobctl.health import (
    JobHealth,
    STALE_HEARTBEAT_SECONDS,
    STARTUP_TIMEOUT_SECONDS,
    JobStatus,
    ensure_failed_recorded,
    inspect_version,
    mark_failed,
    read_launch,
    read_status,
)
from orchestrator.jobctl.launch import StartResult, job_command, restart_version, start_version
from orchestrator.jobctl.stop import StopResult, stop_version

__all__ = [
    "JobHealth", "JobStatus", "StartResult", "StopResult",
    "inspect_version", "read_launch", "read_status", "mark_failed", "ensure_failed_recorded",
    "start_version", "restart_version", "stop_version", "job_command",
    "STALE_HEARTBEAT_SECONDS", "STARTUP_TIMEOUT_SECONDS",
]
