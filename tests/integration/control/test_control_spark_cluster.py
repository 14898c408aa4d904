"""Beyond one machine: a version's job submitted with spark-submit to a Spark standalone cluster.

The cluster is a master and a worker started from the pip-installed pyspark (`spark-class`) on
127.0.0.1 free ports, stopped by their PIDs in the fixture's teardown. The orchestrator runs the
same job code through pyspark's `bin/spark-submit` (client mode) because `spark_master` is the
cluster's URL; the test checks that the job ran on the cluster (an executor on the worker) and
that the served table equals the expected table computed from the log.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from control_live import DEADLINE, PARTITIONS, PIPELINE, Live, make_spec, served_equals_expected
from orchestrator.dev import datagen
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.core.net import free_port
from orchestrator.core.settings import Settings
from orchestrator.context import Kappa
from orchestrator.lifecycle.deploy import deploy
from orchestrator.jobctl import inspect_version, read_launch, stop_version
from orchestrator.lifecycle.promote import promote
from orchestrator.registry import Registry
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def _spark_class() -> tuple[Path, dict[str, str]]:
    import pyspark

    from jobs.lib.runtime.session import spark_env

    home = Path(pyspark.__file__).parent
    env = {**os.environ, **spark_env(), "SPARK_HOME": str(home)}
    return home / "bin" / "spark-class", env


def _running(proc: subprocess.Popen, log: Path) -> None:
    assert proc.poll() is None, f"process exited with {proc.returncode}: {log.read_text()[-2000:]}"


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    def listening() -> bool:
        _running(proc, log)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    wait_until(listening, f"a listener on 127.0.0.1:{port} (log: {log})", timeout, poll=0.3)


def _wait_log(log: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    def logged() -> bool:
        if text in log.read_text(errors="replace"):
            return True
        _running(proc, log)
        return False

    wait_until(logged, f"{text!r} in {log}", timeout, poll=0.3)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Spark standalone master and one worker (2 cores) on 127.0.0.1."""
    spark_class, env = _spark_class()
    work = tmp_path_factory.mktemp("spark-cluster")
    port, ui, worker_ui = free_port(), free_port(), free_port()
    master_log, worker_log = work / "master.log", work / "worker.log"
    procs: list[subprocess.Popen] = []
    try:
        with open(master_log, "wb") as out:
            procs.append(subprocess.Popen(
                [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(ui)],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True))
        _wait_port(port, procs[0], master_log, 180)
        url = f"spark://127.0.0.1:{port}"
        with open(worker_log, "wb") as out:
            procs.append(subprocess.Popen(
                [str(spark_class), "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                 "--cores", "2", "--memory", "2g", "--webui-port", str(worker_ui), "--work-dir", str(work / "work")],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True))
        _wait_log(master_log, "Registering worker", procs[0], 180)
        yield {"url": url, "master_log": master_log, "worker_log": worker_log, "work": work / "work"}
    finally:
        for proc in reversed(procs):
            _stop(proc)


def test_a_version_runs_on_a_standalone_cluster_through_spark_submit(broker, cluster, tmp_path, seed):
    unique = uuid.uuid4().hex[:8]
    topic, alias = f"cluster_profiles_{unique}", f"cluster_std_{unique}"
    datagen.ensure_topic(broker.bootstrap_servers, topic, PARTITIONS)
    settings = Settings(home=tmp_path / "home", bootstrap_servers=broker.bootstrap_servers,
                        spark_master=cluster["url"])
    reg = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    k = Kappa(settings, registry=reg, pipelines={PIPELINE: make_spec(topic, alias)})
    live = Live(broker.bootstrap_servers, topic, alias, settings.home, k, seed=seed)
    try:
        live.produce(1500, 400, first_new=True)
        info = deploy(k, k.pipeline(PIPELINE), "v2", actor="ops", reason="run on the cluster")
        launch = read_launch(k.version(PIPELINE, info.version))
        assert launch["mode"] == "spark-submit" and launch["master"] == cluster["url"]
        assert launch["command"][0].endswith("bin/spark-submit")
        r = wait_ready(k.version(PIPELINE, info.version), deadline_seconds=DEADLINE, poll_seconds=1)
        assert r.ready and r.total_lag == 0
        # the executor ran on the cluster's worker, under its work dir, for this application
        app_dirs = [p for p in cluster["work"].iterdir() if p.name.startswith("app-")]
        assert app_dirs, f"no application ran on the worker; {cluster['worker_log'].read_text()[-1500:]}"
        promote(k.version(PIPELINE, info.version), actor="ops", reason="first on the cluster")
        ok, why = served_equals_expected(live, "v2")
        assert ok, why
        stopped = stop_version(k.version(PIPELINE, info.version), actor="ops", reason="done", force=True)
        assert stopped.stopped and stopped.final_state == "stopped"
        assert not inspect_version(k.version(PIPELINE, info.version)).alive
    finally:
        live.close()
        reg.close()
