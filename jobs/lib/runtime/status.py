"""The job's status file, ``<run-dir>/status.json``: what the orchestrator reads to watch a job.

The states here are the job process's own (`RunState`), not the registry's version states: a
version that is ``backfilling`` has a job that is ``running``, and ``stopping``/``finished`` exist
only for the process.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.core.exceptions import KappaError
from orchestrator.core.files import read_json, write_json_atomic
from orchestrator.core.states import RunState

__all__ = ["RunState", "Status", "read_status", "summarize_error"]


def read_status(run_dir: str | Path) -> dict | None:
    """The job's last status, or None if it has not written one (or it cannot be parsed)."""
    return read_json(Path(run_dir, "status.json"))


class Status:
    """The in-memory status of the job; every change is written through to status.json."""

    def __init__(self, path: Path, pipeline: str, version: int, trigger: str):
        self.path = Path(path)
        self._lock = threading.RLock()
        self.data: dict[str, Any] = {
            "pipeline": pipeline, "version": version, "pid": os.getpid(), "state": RunState.STARTING,
            "started_at": time.time(), "heartbeat_at": time.time(), "batch_id": None, "batches": 0,
            "rows_in": 0, "rows_out": 0, "rejects": 0, "rejects_total": None, "end_offsets": None,
            "error": None, "rules_hash": None, "query_id": None, "trigger": trigger, "last_batch": None,
            "backfill": None,
        }

    def update(self, **fields: Any) -> None:
        """Apply ``fields``, stamp the heartbeat and replace status.json (atomically)."""
        with self._lock:
            self.data.update(fields)
            self.data["heartbeat_at"] = time.time()
            write_json_atomic(self.path, self.data)


#: Where kappa's exceptions live, as a traceback that crossed into the JVM and back names them.
_KAPPA_MODULE = re.escape(KappaError.__module__ + ".")
_KAPPA_RAISED = re.compile(_KAPPA_MODULE + r"(\w+): (.+)")
_ANY_ERROR = re.compile(r"(?:" + _KAPPA_MODULE + r"|\b)((?:[A-Z]\w*)?(?:Error|Exception)): (.+)")


def summarize_error(e: BaseException) -> str:
    """One line a person can act on: a kappa error's own message, else the deepest cause."""
    if isinstance(e, KappaError):
        return f"{type(e).__name__}: {e}"
    text = str(e)
    kappa = _KAPPA_RAISED.findall(text)
    if kappa:
        name, msg = kappa[-1]
        return f"{name}: {msg.strip()}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        m = _ANY_ERROR.search(ln)
        if m and not ln.startswith("at "):
            return f"{m.group(1)}: {m.group(2)}"[:2000]
    first = lines[0] if lines else type(e).__name__
    return f"{type(e).__name__}: {first}"[:2000]
