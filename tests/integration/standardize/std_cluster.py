"""A Spark standalone cluster for the standardize cluster test, and the driver it runs.

Two halves:

- `Cluster` (the test's process): a master and workers of 1 core each,
  started from the pip-installed pyspark (`spark-class`) on 127.0.0.1 free ports, each in a
  session of its own, stopped by their own PIDs (SIGTERM to the process group: the JVM and the
  executors it launched). The pattern of tests/integration/control/test_control_spark_cluster.py.
- `python std_cluster.py <request.json>` (a process of its own, because the test session may
  already hold the shared local SparkContext and a process has one): a client-mode driver
  against the cluster runs the standardize job's own `start_query` available-now, then reads
  what Spark's REST API says about every stage and task of the application (executor, status,
  result size, records read, bytes written) and writes it as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from argparse import Namespace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _spark_class() -> tuple[Path, dict[str, str]]:
    import pyspark

    from jobs.lib.runtime.session import spark_env

    home = Path(pyspark.__file__).parent
    return home / "bin" / "spark-class", {**os.environ, **spark_env(), "SPARK_HOME": str(home)}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _wait(what: str, ready, procs: list[subprocess.Popen], logs: list[Path], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        for proc, log in zip(procs, logs):
            if proc.poll() is not None:
                raise RuntimeError(f"{what}: a Spark process exited with {proc.returncode}; "
                                   f"{log}: {log.read_text(errors='replace')[-1500:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not ready within {timeout:.0f} s; see {', '.join(map(str, logs))}")
        time.sleep(0.3)


class Cluster:
    """A master plus workers of `cores` cores each; `stop()` ends every process it started, also
    after a failed `start()`."""

    def __init__(self, work: Path, workers: int = 2, *, cores: int = 1, memory: str = "1g"):
        self.work, self.workers, self.cores, self.memory = Path(work), workers, cores, memory
        self.url: str | None = None
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _spawn(self, args: list[str], log: Path) -> None:
        exe, env = _spark_class()
        with open(log, "wb") as out:
            self.procs.append(subprocess.Popen([str(exe), *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                               cwd=self.work, stdin=subprocess.DEVNULL, start_new_session=True))
        self.logs.append(log)

    def start(self, timeout: float = 120.0) -> "Cluster":
        self.work.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        master_log = self.work / "master.log"
        self._spawn(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                     "--webui-port", str(_free_port())], master_log)
        _wait(f"the Spark master on 127.0.0.1:{port}", lambda: _listening(port), self.procs, self.logs, timeout)
        self.url = f"spark://127.0.0.1:{port}"
        for n in range(1, self.workers + 1):
            self._spawn(["org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                         "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(_free_port()),
                         "--work-dir", str(self.work / f"work-{n}")], self.work / f"worker-{n}.log")
        _wait(f"{self.workers} workers registered with {self.url}",
              lambda: master_log.read_text(errors="replace").count("Registering worker") >= self.workers,
              self.procs, self.logs, timeout)
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM each process group (the JVM and the executors it launched), workers first;
        SIGKILL what outlives `timeout`."""
        for proc in reversed(self.procs):
            if proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout)
            except ProcessLookupError:
                pass


def run_driver(request: dict, work: Path, timeout: float = 300.0) -> tuple[dict | None, str]:
    """Run this file as the driver for `request`; (its JSON result or None, its log text)."""
    from jobs.lib.runtime.session import spark_env

    req, result, log = work / "request.json", work / "result.json", work / "driver.log"
    req.write_text(json.dumps({**request, "result": str(result)}), encoding="utf-8")
    env = {**os.environ, **spark_env(), "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, __file__, str(req)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=ROOT, start_new_session=True)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    text = log.read_text(errors="replace")
    if proc.returncode != 0 or not result.exists():
        return None, f"driver exited with {proc.returncode}; {log}:\n{text[-4000:]}"
    return json.loads(result.read_text(encoding="utf-8")), text


# --------------------------------------------------------------------------------------------
# The driver process
# --------------------------------------------------------------------------------------------

def _get(ui: str, path: str):
    with urllib.request.urlopen(f"{ui}/api/v1{path}", timeout=30) as r:
        return json.loads(r.read())


def _wait_executors(ui: str, app: str, n: int, timeout: float) -> list[dict]:
    """Block until `n` executors besides the driver are registered: otherwise the first tasks
    could all land on the one that came first."""
    deadline = time.monotonic() + timeout
    while True:
        execs = [e for e in _get(ui, f"/applications/{app}/executors") if e["id"] != "driver" and e["isActive"]]
        if len(execs) >= n:
            return execs
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(execs)} of {n} executors registered within {timeout:.0f} s")
        time.sleep(0.3)


def _tasks(stage: dict) -> list[dict]:
    def metric(t: dict, group: str, name: str) -> int:
        return int(((t.get("taskMetrics") or {}).get(group) or {}).get(name, 0))

    return [{"executor": t.get("executorId"), "status": t.get("status"),
             "result_size": int((t.get("taskMetrics") or {}).get("resultSize", 0)),
             "records_read": metric(t, "inputMetrics", "recordsRead"),
             "bytes_written": metric(t, "outputMetrics", "bytesWritten")}
            for t in (stage.get("tasks") or {}).values()]


def driver_main(request_path: str) -> None:
    from jobs.lib.rules.files import load_rules
    from jobs.lib.runtime.session import build_session
    from jobs.lib.runtime.stream import kafka_options
    from jobs.standardize import start_query

    req = json.loads(Path(request_path).read_text(encoding="utf-8"))
    spark = build_session("kappa-standardize-cluster", master=req["master"], local_dir=req["local_dir"], extra={
        "spark.ui.enabled": "true", "spark.ui.port": str(req["ui_port"]), "spark.ui.showConsoleProgress": "false",
        "spark.executor.cores": "1", "spark.cores.max": str(req["executors"]), "spark.executor.memory": "1g"})
    try:
        sc = spark.sparkContext
        ui, app = sc.uiWebUrl.rstrip("/"), sc.applicationId
        _wait_executors(ui, app, req["executors"], 120)
        args = Namespace(**req["args"])
        options = kafka_options(req["bootstrap"], req["topic"], max_offsets_per_trigger=1000,
                                min_partitions=req["min_partitions"])
        query, writer = start_query(spark, args, load_rules(req["rules"]), options, {"availableNow": True})
        try:
            query.awaitTermination()
        finally:
            if query.isActive:
                query.stop()
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        # every task and stage event reaches the UI's store before we read it
        sc._jsc.sc().listenerBus().waitUntilEmpty(60_000)
        stages = _get(ui, f"/applications/{app}/stages?details=true&withSummaries=false")
        executors = _get(ui, f"/applications/{app}/executors")
        result = {
            "app": app,
            "executors": [{"id": e["id"], "total_tasks": e["totalTasks"], "completed_tasks": e["completedTasks"]}
                          for e in executors],
            "stages": [{"id": s["stageId"], "attempt": s["attemptId"], "status": s["status"],
                        "name": s.get("name"), "description": s.get("description") or "", "tasks": _tasks(s)}
                       for s in stages],
            "timings": writer.timings,
            "skipped": writer.skipped,
        }
    finally:
        spark.stop()
    Path(req["result"]).write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    driver_main(sys.argv[1])
