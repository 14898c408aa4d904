"""Real credentials: the session broker's SASL/SCRAM listener checks them.

`kappa.toml` holds the SCRAM user's password in `[kafka_config]`; a real standardize job started by
`deploy` (Spark) reads the topic through that listener, catches up and is promoted. The password is
nowhere but the version's 0600 `kafka.json` (and the kappa.toml the operator wrote). Searched:
every file under the kappa home, /proc/*/cmdline and /proc/*/environ of every process this user
can read, the registry (versions, audit log), `kappa status` (text and JSON), every message.

A wrong password: `kappa deploy` fails with one line that names the listener and the settings to
fix, shows no password, and leaves nothing behind: no version in the registry, no version folder,
no job. (The Airflow Connection route: tests/integration/airflow/test_airflow_kafka_connection.py.)
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

from orchestrator.core.settings import resolve_settings
from orchestrator.context import Kappa
from orchestrator.dev import datagen
from orchestrator.dev.broker import SCRAM_MECHANISM
from orchestrator.jobctl import inspect_version
from orchestrator.jobctl.health import CHILDREN
from orchestrator.lifecycle.await_ready import wait_ready
from orchestrator.lifecycle.deploy import deploy
from orchestrator.lifecycle.promote import promote
from orchestrator.lifecycle.reconcile import reconcile
from tests.conftest import SCRAM_USER
from tests.pipelines import standardize_pipeline
from tests.teardown import kill_jobs
from tests.shell import users_env

pytestmark = pytest.mark.integration

DEADLINE = float(os.environ.get("KAPPA_TEST_READY_DEADLINE", "900"))


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


def _kappa(config: Path, *args: str) -> subprocess.CompletedProcess:
    env = users_env()
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=300, env=env)


def _setup(tmp_path: Path, broker, password: str, seed: int) -> tuple[str, Path, Path]:
    """A topic with profiles (written through the plaintext listener), a pipelines file and a
    kappa.toml that reads through the SCRAM listener with `password`."""
    unique = uuid.uuid4().hex[:8]
    pipeline, topic = f"sec_{unique}", f"sec_profiles_{unique}"
    datagen.ensure_topic(broker.bootstrap_servers, topic, partitions=2)
    datagen.produce(broker.bootstrap_servers, topic, datagen.generate_changelog(200, 60, seed=seed))
    pipelines_file = tmp_path / "pipelines.toml"
    pipelines_file.write_text(standardize_pipeline(pipeline, topic))
    home = tmp_path / "home"
    config = tmp_path / "kappa.toml"
    config.write_text(f"""home = "{home}"
pipelines_file = "{pipelines_file}"
bootstrap_servers = "{broker.sasl_bootstrap_servers}"

[kafka_config]
"security.protocol" = "SASL_PLAINTEXT"
"sasl.mechanism" = "{SCRAM_MECHANISM}"
"sasl.username" = "{SCRAM_USER}"
"sasl.password" = "{password}"
""")
    return pipeline, home, config


def _stop_everything(k: Kappa, pipeline: str) -> None:
    kill_jobs(k, [pipeline])
    for pid, proc in list(CHILDREN.items()):
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        CHILDREN.pop(pid, None)


def test_scram_credentials_from_kappa_toml_are_only_in_the_0600_config_file(broker, tmp_path, seed):
    secret = broker.scram_users[SCRAM_USER]
    pipeline, home, config = _setup(tmp_path, broker, secret, seed)
    k = Kappa(resolve_settings(config, env={}))
    assert k.settings.bootstrap_servers == broker.sasl_bootstrap_servers
    messages: list[str] = []
    try:
        info = deploy(k, k.pipeline(pipeline), "v1", actor="ops:secrets-test", reason="secrets")
        paths = k.paths(pipeline, info.version)
        messages.append(info.model_dump_json())
        r = wait_ready(k.version(pipeline, info.version), poll_seconds=1, deadline_seconds=DEADLINE,
                       on_sample=lambda r: messages.append(r.model_dump_json()))
        assert r.ready, r.summary()
        messages.append(r.summary())
        messages.append(str(promote(k.version(pipeline, info.version), actor="ops:secrets-test", reason="secrets")))
        st = inspect_version(k.version(pipeline, info.version))
        messages.append(st.model_dump_json())
        assert st.health == "running", st.describe()
        # While the job runs: the process list.
        assert _processes_holding(secret.encode()) == []
        for extra in ([], ["--json"]):
            out = _kappa(config, "status", *extra)
            assert out.returncode == 0, out.stderr
            messages.append(out.stdout + out.stderr)
        messages.append(json.dumps(reconcile(k, actor="ops:secrets-test"), default=str))
    finally:
        _stop_everything(k, pipeline)
    audit = [a.model_dump(mode="json") for a in k.registry.audit_log(pipeline, limit=None)]
    versions = [v.model_dump(mode="json") for v in k.registry.list_versions(pipeline)]
    k.close()
    assert audit and versions and all(messages)
    for text in [*messages, json.dumps(audit), json.dumps(versions)]:
        assert secret not in text
    held = _files_holding(home, secret.encode())
    assert held == {str(paths.version_dir.relative_to(home) / "kafka.json"): 0o600}
    assert "sasl.password" not in Path(paths.log_file).read_text()       # job.log: not even the setting's name


def test_a_wrong_scram_password_is_one_line_and_starts_nothing(broker, tmp_path, seed):
    wrong = f"wrong-{uuid.uuid4().hex}"
    pipeline, home, config = _setup(tmp_path, broker, wrong, seed)
    out = _kappa(config, "deploy", pipeline, "--rules", "v1", "--reason", "a wrong password")
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0] == (
        f"Error: the Kafka broker's SASL_PLAINTEXT listener at {broker.sasl_bootstrap_servers} refused kappa's "
        f"credentials (sasl.mechanism={SCRAM_MECHANISM}, sasl.username='{SCRAM_USER}'): fix sasl.username / "
        f"sasl.password in the Kafka settings ([kafka_config] in kappa.toml, KAPPA_KAFKA_CONFIG, or the "
        f"Airflow Connection kafka_default)")
    assert wrong not in out.stdout + out.stderr
    with Kappa(resolve_settings(config, env={})) as k:
        assert k.registry.list_versions(pipeline) == []
        assert k.registry.audit_log(pipeline, limit=None) == [] or all(
            wrong not in json.dumps(a.model_dump(mode="json")) for a in k.registry.audit_log(pipeline, limit=None))
    assert not (home / "state" / pipeline).exists() or not any((home / "state" / pipeline).iterdir())
    assert _processes_holding(wrong.encode()) == []
