"""A Spark standalone cluster on this machine, from the pip-installed pyspark (`spark-class`).

For the cluster benchmark and the cluster tests: a master and workers on 127.0.0.1 free ports,
each in a session of its own, stopped by their own PIDs (process group: the JVM and anything it
spawned). Python applications run against it in client mode; the driver needs
`spark.driver.host=127.0.0.1` (kappa's sessions set it) and executors find the project through
`spark.executorEnv.PYTHONPATH` (also set by `jobs.lib.runtime.session.build_session`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from orchestrator.core.exceptions import LifecycleError

__all__ = ["spark_class", "StandaloneCluster"]


def spark_class() -> tuple[Path, dict[str, str]]:
    """pyspark's `bin/spark-class` and the environment to run it with."""
    import pyspark

    from jobs.lib.runtime.session import spark_env

    home = Path(pyspark.__file__).parent
    return home / "bin" / "spark-class", {**os.environ, **spark_env(), "SPARK_HOME": str(home)}


class StandaloneCluster:
    """A master plus workers added one at a time (`add_worker`); `stop()` ends them all by PID."""

    def __init__(self, work: Path, *, timeout: float = 180.0):
        self.work = Path(work)
        self.timeout = timeout
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []
        self.url: str | None = None
        self.master_log = self.work / "master.log"
        self.workers = 0

    @property
    def pids(self) -> list[int]:
        return [p.pid for _, p, _ in self.procs]

    def _spawn(self, name: str, args: list[str], log: Path) -> subprocess.Popen:
        exe, env = spark_class()
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(exe), *args], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.work,
                                    start_new_session=True)
        self.procs.append((name, proc, log))
        return proc

    def _check(self, proc: subprocess.Popen, log: Path) -> None:
        if proc.poll() is not None:
            raise LifecycleError(f"a Spark standalone process exited with {proc.returncode} while starting; "
                                 f"see {log}: {log.read_text(errors='replace')[-800:]}")

    def _wait(self, what: str, ready, proc: subprocess.Popen, log: Path) -> None:
        deadline = time.monotonic() + self.timeout
        while not ready():
            self._check(proc, log)
            if time.monotonic() > deadline:
                raise LifecycleError(f"{what} not ready within {self.timeout:.0f} s; see {log}")
            time.sleep(0.3)

    def start(self) -> "StandaloneCluster":
        from orchestrator.core.net import free_port

        self.work.mkdir(parents=True, exist_ok=True)
        port, ui = free_port(), free_port()
        proc = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                      "--port", str(port), "--webui-port", str(ui)], self.master_log)

        def listening() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                return False

        self._wait(f"the Spark master on 127.0.0.1:{port}", listening, proc, self.master_log)
        self.url = f"spark://127.0.0.1:{port}"
        return self

    def add_worker(self, cores: int = 1, memory: str = "2g") -> int:
        """Start one more worker and wait until the master has registered it; its PID."""
        from orchestrator.core.net import free_port

        if self.url is None:
            raise LifecycleError("start the cluster's master before adding workers")
        n = self.workers + 1
        log = self.work / f"worker-{n}.log"
        proc = self._spawn(f"worker {n}", ["org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                                           "--cores", str(cores), "--memory", memory, "--webui-port",
                                           str(free_port()), "--work-dir", str(self.work / f"work-{n}")], log)
        _, master, _ = self.procs[0]

        def registered() -> bool:
            self._check(master, self.master_log)
            return self.master_log.read_text(errors="replace").count("Registering worker") >= n

        self._wait(f"worker {n} of {self.url}", registered, proc, log)
        self.workers = n
        return proc.pid

    def stop(self, timeout: float = 20.0) -> list[tuple[str, int]]:
        """SIGTERM each process group (workers first), SIGKILL what outlives `timeout`; (name, pid) of each."""
        stopped = []
        for name, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            try:  # executors and other stragglers of the group
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            stopped.append((name, proc.pid))
        return stopped

    def __enter__(self) -> "StandaloneCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
