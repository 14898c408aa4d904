"""A recognisable SASL password in the Kafka config, a real standardize job started by `deploy`
(Spark, the session's tansu broker): the password is nowhere but the version's 0600 `kafka.json`.
Searched: every file under the kappa home, /proc/*/cmdline and /proc/*/environ of every process
this user can read, the registry (versions, audit log), `kappa status` (text and JSON), every
error message.

Two runs. `plaintext`: the SASL settings ride along unused (security.protocol stays PLAINTEXT),
so the job runs, catches up and is promoted. `sasl`: SASL_PLAINTEXT against tansu, which drops
the SASL handshake ("broker transport failure"): `deploy` refuses (it cannot read the topic), so
the version is allocated with plaintext settings and its job started with the SASL ones; the job
cannot read, and whatever happens (it fails, or the wait times out), the messages that say so must
not show the password either.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from orchestrator.core.exceptions import KappaError
from orchestrator.core.kappa import Kappa
from orchestrator.core.settings import Settings
from orchestrator.dev import datagen
from orchestrator.jobctl import inspect_version, start_version, stop_version
from orchestrator.jobctl.health import CHILDREN
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.reconcile import reconcile
from tests.pipelines import standardize_pipeline

pytestmark = pytest.mark.integration

DEADLINE = float(os.environ.get("KAPPA_TEST_READY_DEADLINE", "900"))
#: How long the `sasl` run waits for a job that cannot authenticate (it may never fail by itself).
SASL_WAIT = 60.0


def _pipelines_file(path: Path, pipeline: str, topic: str) -> Path:
    path.write_text(standardize_pipeline(pipeline, topic))
    return path


def _files_holding(root: Path, secret: bytes) -> dict[str, int]:
    """{path: mode} of every file under `root` whose bytes contain `secret`."""
    found = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            try:
                if p.is_symlink() or not p.is_file():
                    continue
                if secret in p.read_bytes():
                    found[str(p.relative_to(root))] = stat.S_IMODE(p.stat().st_mode)
            except OSError:
                continue
    return found


def _processes_holding(secret: bytes) -> list[str]:
    """The /proc/<pid>/{cmdline,environ} this user can read that contain `secret`."""
    hits = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for what in ("cmdline", "environ"):
            try:
                if secret in Path(f"/proc/{pid}/{what}").read_bytes():
                    hits.append(f"{pid}/{what}")
            except OSError:
                continue
    return hits


def _kappa_status(home: Path, pipelines_file: Path, bootstrap: str, kafka_config: dict) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPPA_")}
    env["KAPPA_KAFKA_CONFIG"] = json.dumps(kafka_config)   # the environment, never the command line
    out = []
    for extra in ([], ["--json"]):
        proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "--home", str(home), "--pipelines-file",
                               str(pipelines_file), "--bootstrap-servers", bootstrap, "status", *extra],
                              capture_output=True, text=True, timeout=300, env=env)
        out.append(proc.stdout + proc.stderr)
    return "\n".join(out)


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SASL_PLAINTEXT"], ids=["plaintext", "sasl"])
def test_a_sasl_password_is_only_in_the_0600_config_file(bootstrap, tmp_path, seed, protocol):
    secret = f"kappa-sasl-{uuid.uuid4().hex}"
    unique = uuid.uuid4().hex[:8]
    pipeline, topic = f"sec_{unique}", f"sec_profiles_{unique}"
    datagen.ensure_topic(bootstrap, topic, partitions=2)
    datagen.produce(bootstrap, topic, datagen.generate_changelog(200, 60, seed=seed))
    kafka_config = {"security.protocol": protocol, "sasl.mechanism": "PLAIN", "sasl.username": "kappa",
                    "sasl.password": secret}
    home = tmp_path / "home"
    pipelines_file = _pipelines_file(tmp_path / "pipelines.toml", pipeline, topic)
    k = Kappa(Settings(home=home, pipelines_file=pipelines_file, bootstrap_servers=bootstrap,
                       kafka_config=kafka_config))
    messages: list[str] = []
    try:
        if protocol == "PLAINTEXT":
            info = deploy(k, pipeline, "v1", actor="ops:secrets-test", reason="secrets")
        else:
            with pytest.raises(KappaError) as refused:
                deploy(k, pipeline, "v1", actor="ops:secrets-test", reason="secrets")
            print(f"{protocol}: deploy refused: {refused.value}")
            messages.append(str(refused.value))
            plain = {"security.protocol": "PLAINTEXT"}
            with Kappa(Settings(home=home, pipelines_file=pipelines_file, bootstrap_servers=bootstrap,
                                kafka_config=plain), registry=k.registry) as k_plain:
                info = deploy(k_plain, pipeline, "v1", actor="ops:secrets-test", reason="secrets", start=False)
                k_plain._registry = None     # k's registry: not closed by k_plain
            try:
                messages.append(start_version(k, pipeline, info.version, actor="ops:secrets-test").message)
            except KappaError as e:           # the job may exit at once: its message is checked too
                messages.append(str(e))
        paths = k.paths(pipeline, info.version)
        messages.append(info.model_dump_json())
        try:
            r = wait_ready(k, pipeline, info.version, poll_seconds=1,
                           deadline_seconds=DEADLINE if protocol == "PLAINTEXT" else SASL_WAIT,
                           on_sample=lambda r: messages.append(r.model_dump_json()))
            messages.append(r.summary())
            if protocol == "PLAINTEXT":
                messages.append(str(promote(k, pipeline, info.version, actor="ops:secrets-test", reason="secrets")))
        except KappaError as e:
            print(f"{protocol}: the wait ended with: {e}")
            messages.append(str(e))
            assert protocol == "SASL_PLAINTEXT", f"the plaintext job should become ready: {e}"
        st = inspect_version(k, pipeline, info.version)
        print(f"{protocol}: job {st.describe()}")
        messages.append(st.model_dump_json())
        # While the job runs (or has just failed): the process list.
        assert _processes_holding(secret.encode()) == []
        messages.append(_kappa_status(home, pipelines_file, bootstrap, kafka_config))
        messages.append(json.dumps(reconcile(k, actor="ops:secrets-test"), default=str))
    finally:
        for rec in k.registry.list_versions(pipeline):
            if inspect_version(k, pipeline, rec.version).alive:
                stop_version(k, pipeline, rec.version, actor="tests", reason="teardown", force=True,
                             graceful_timeout=20, final_state=None)
        for pid, proc in list(CHILDREN.items()):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            CHILDREN.pop(pid, None)
    audit = [a.model_dump(mode="json") for a in k.registry.audit_log(pipeline, limit=None)]
    versions = [v.model_dump(mode="json") for v in k.registry.list_versions(pipeline)]
    k.close()
    assert audit and versions and all(messages)
    for text in [*messages, json.dumps(audit), json.dumps(versions)]:
        assert secret not in text
    held = _files_holding(home, secret.encode())
    assert held == {str(paths.version_dir.relative_to(home) / "kafka.json"): 0o600}
    assert "sasl.password" not in paths.log_file.read_text()       # job.log: not even the setting's name
