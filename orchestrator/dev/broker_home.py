"""The background embedded broker of a kappa home: `<home>/broker.json`.

`kappa broker start` and `kappa demo` record the broker they leave running there (its PID and
creation time, port, log). Commands run against that home without configured bootstrap servers
use it; `kappa broker stop` stops it by PID. A record whose process is no longer ours is stale.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from orchestrator.core.exceptions import BrokerError
from orchestrator.core.files import read_json, write_json_atomic
from orchestrator.jobctl.process import create_time, is_ours

__all__ = ["BROKER_FILE", "broker_file", "read_broker_file", "write_broker_file"]

BROKER_FILE = "broker.json"


def broker_file(home: Path | str) -> Path:
    return Path(home) / BROKER_FILE


def read_broker_file(home: Path | str) -> dict[str, Any] | None:
    """The background broker recorded under `home`, if its process still runs (else None)."""
    data = read_json(broker_file(home))
    if not isinstance(data, dict) or not is_ours(int(data.get("pid") or 0), data.get("created")):
        return None
    return data


def write_broker_file(home: Path | str, pid: int, port: int, log: Path | None = None, *,
                      owner: str = "kappa broker start") -> dict[str, Any]:
    """Record the broker process `pid` listening on 127.0.0.1:`port` as the one of `home`."""
    created = create_time(pid)
    if created is None:
        raise BrokerError(f"the embedded broker (pid {pid}) exited right after it started"
                          + (f"; see {log}" if log else ""))
    data = {"pid": pid, "port": port, "bootstrap_servers": f"127.0.0.1:{port}",
            "created": created, "log": str(log) if log else None,
            "started_at": time.time(), "owner": owner}
    write_json_atomic(broker_file(home), data, indent=None)
    return data
