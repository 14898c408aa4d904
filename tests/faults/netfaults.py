"""Fixtures of the fault suite's network and paused-process scenarios (issue 33).

- `Toxiproxy`: Shopify's Toxiproxy server (`toxiproxy-server`, v2.5.0, which `deploy/dev.sh setup` and
  `deploy/dev.sh test` install into the venv's bin) on 127.0.0.1, started and stopped by its PID and
  driven through its HTTP API: a proxy in front of the broker, and toxics on it (`timeout` with
  timeout=0 both ways: a cut, nothing gets through and no connection closes; `latency` with jitter;
  `reset_peer`: a TCP reset of every connection that carries data).
- `delta_batches`: which micro-batch each commit of a Delta table wrote, from its log (`txn` actions),
  for the oracle that no batch is written twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from orchestrator.core.net import free_port
from orchestrator.jobctl.process import create_time, stop_process

__all__ = ["TOXIPROXY_VERSION", "Toxiproxy", "toxiproxy_binary", "delta_batches"]

#: The version `deploy/dev.sh` installs (keep the two in step).
TOXIPROXY_VERSION = "2.5.0"
SETUP = "deploy/dev.sh setup"


def toxiproxy_binary() -> Path:
    """The Toxiproxy server the set-up installed into the venv; the test fails (one line) without it."""
    path = Path(sys.prefix) / "bin" / "toxiproxy-server"
    if not path.is_file():
        pytest.fail(f"Toxiproxy {TOXIPROXY_VERSION} is not installed at {path}: run `{SETUP}` (it builds it with "
                    f"`go install github.com/Shopify/toxiproxy/v2/cmd/server@v{TOXIPROXY_VERSION}`)", pytrace=False)
    return path


@dataclass
class Toxiproxy:
    """A Toxiproxy server on 127.0.0.1 whose log lives in `log_path`; `stop()` ends it by its PID."""

    log_path: Path
    port: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False)
    created: float | None = field(default=None, repr=False)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> "Toxiproxy":
        binary = toxiproxy_binary()
        self.port = self.port or free_port()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(binary), "-host", "127.0.0.1", "-port", str(self.port)],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.created = create_time(self.proc.pid)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"toxiproxy-server exited with code {self.proc.returncode}; see {self.log_path}")
            try:
                if requests.get(f"{self.api}/version", timeout=1).ok:
                    return self
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"toxiproxy-server did not answer on {self.api} within {timeout:.0f} s; "
                                   f"see {self.log_path}")
            time.sleep(0.1)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            stop_process(proc.pid, self.created, 10.0)
            proc.wait(10)

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        r = requests.request(method, f"{self.api}{path}", json=body, timeout=10)
        if not r.ok:
            raise RuntimeError(f"toxiproxy {method} {path} {body}: {r.status_code} {r.text.strip()}")
        return r.json() if r.content else {}

    def proxy(self, name: str, upstream_port: int, listen_port: int | None = None) -> int:
        """Create the proxy `name` from 127.0.0.1:`listen_port` (a free one by default) to the upstream;
        its listening port."""
        listen_port = listen_port or free_port()
        self._call("POST", "/proxies", {"name": name, "listen": f"127.0.0.1:{listen_port}",
                                        "upstream": f"127.0.0.1:{upstream_port}", "enabled": True})
        return listen_port

    def add(self, proxy: str, name: str, kind: str, attributes: dict, *, streams=("downstream", "upstream")) -> None:
        """Add the toxic `kind` with `attributes` to each of `streams` (named `<name>-<stream>`)."""
        for stream in streams:
            self._call("POST", f"/proxies/{proxy}/toxics", {"name": f"{name}-{stream}", "type": kind, "stream": stream,
                                                            "toxicity": 1.0, "attributes": attributes})

    def remove(self, proxy: str, name: str) -> None:
        """Remove every toxic `name` added (all its streams)."""
        for t in self._call("GET", f"/proxies/{proxy}/toxics") or []:
            if t["name"].startswith(f"{name}-"):
                self._call("DELETE", f"/proxies/{proxy}/toxics/{t['name']}")

    def toxics(self, proxy: str) -> list[str]:
        return [t["name"] for t in self._call("GET", f"/proxies/{proxy}/toxics") or []]


def delta_batches(table: str, app_id: str | None = None) -> list[tuple[int, str, int, float]]:
    """[(commit version, app id, batch id, commit timestamp in s)] of the table's commits that carry an
    application transaction (the jobs' idempotent batch writes), in commit order, from `_delta_log`."""
    out = []
    for f in sorted(Path(table, "_delta_log").glob("*.json")):
        txns, ts = [], None
        for line in f.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                txns.append((action["txn"]["appId"], int(action["txn"]["version"])))
            if "commitInfo" in action:
                ts = action["commitInfo"].get("timestamp", 0) / 1000.0
        for app, batch in txns:
            if app_id is None or app == app_id:
                out.append((int(f.stem), app, batch, ts))
    return out
