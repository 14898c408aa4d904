"""Kafka secrets reach a job through a 0600 file, never its command line or environment, and are
masked wherever a job's own text (its error, its log) is quoted: messages, registry, audit, status."""

from __future__ import annotations

import json
import os
import stat
import sys
import time

import pytest

from control_helpers import PIPELINE, allocate, fake_running
from jobs.lib.runtime.args import parse_args
from orchestrator.core.exceptions import ConfigError, LifecycleError
from orchestrator.core.secrets import mask_secrets, secret_values
from orchestrator.core.settings import Settings
from orchestrator.jobctl import launch
from orchestrator.jobctl.health import CHILDREN, inspect_version, mark_failed

SECRET = "Kappa-SASL-pw-7d1e\"x"   # a quote, so that its JSON-escaped form differs


@pytest.fixture
def ks(k):
    """`k` with SASL settings holding SECRET."""
    k.settings = Settings(home=k.settings.home, bootstrap_servers=k.settings.bootstrap_servers,
                          registry_url="postgresql+psycopg2://kappa:db-pw-42@db/kappa",
                          kafka_config={"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                        "sasl.username": "kappa", "sasl.password": SECRET})
    return k


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("master", ["local[2]", "spark://127.0.0.1:7077"])
def test_the_command_line_holds_a_path_not_the_secret(ks, master):
    v = allocate(ks).version
    cmd, _ = launch.job_command(ks.version(PIPELINE, v), master=master)
    assert not any(SECRET in a or "sasl" in a for a in cmd)      # was: --kafka-config {"sasl.password": ...}
    path = ks.paths(PIPELINE, v).version_dir / "kafka.json"
    assert cmd[cmd.index("--kafka-config-file") + 1] == str(path)
    assert _mode(path) == 0o600 and json.loads(path.read_text())["sasl.password"] == SECRET
    args = parse_args(cmd[cmd.index("--pipeline"):])              # what the job makes of it
    assert args.kafka_config == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                 "sasl.username": "kappa", "sasl.password": SECRET}


def test_no_kafka_config_means_no_file(k):
    v = allocate(k).version
    stale = k.paths(PIPELINE, v).version_dir / "kafka.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    cmd, _ = launch.job_command(k.version(PIPELINE, v))
    assert "--kafka-config-file" not in cmd and not stale.exists()


def test_the_job_environment_has_no_secret(monkeypatch):
    monkeypatch.setenv("KAPPA_KAFKA_CONFIG", json.dumps({"sasl.password": SECRET}))
    monkeypatch.setenv("KAPPA_REGISTRY_URL", "postgresql://kappa:db-pw-42@db/kappa")
    env = launch._job_env("local[2]")
    assert not any(SECRET in v or "db-pw-42" in v for v in env.values())
    assert env["KAPPA_SPARK_MASTER"] == "local[2]"


def test_the_job_refuses_a_secret_on_its_command_line_and_a_file_others_can_read(tmp_path):
    base = ["--pipeline", "p", "--version", "1", "--bootstrap-servers", "b:9", "--topics", "t", "--output",
            str(tmp_path / "o"), "--checkpoint", str(tmp_path / "c"), "--run-dir", str(tmp_path / "r")]
    with pytest.raises(ConfigError) as e:
        parse_args(base + ["--kafka-config", json.dumps({"sasl.password": SECRET})])
    assert SECRET not in str(e.value) and "--kafka-config-file" in str(e.value)
    f = tmp_path / "kafka.json"
    f.write_text(json.dumps({"sasl.password": SECRET, "security.protocol": "SSL"}))
    f.chmod(0o644)
    with pytest.raises(ConfigError) as e:
        parse_args(base + ["--kafka-config-file", str(f)])
    assert str(e.value) == (f"the Kafka config file {f} is readable by others (mode 0644); it may hold secrets: "
                            f"`chmod 600 {f}`")
    f.chmod(0o600)
    args = parse_args(base + ["--kafka-config-file", str(f), "--kafka-config", '{"security.protocol": "SASL_SSL"}'])
    assert args.kafka_config == {"sasl.password": SECRET, "security.protocol": "SASL_SSL"}  # the flag overrides


def test_mask_secrets_masks_plain_and_json_escaped_values(ks):
    assert secret_values(ks.settings) == sorted([SECRET, "db-pw-42"], key=len, reverse=True)
    text = f"auth failed for {SECRET}; config {json.dumps({'sasl.password': SECRET})}; db db-pw-42"
    masked = mask_secrets(text, ks.settings)
    assert masked == 'auth failed for ***; config {"sasl.password": "***"}; db ***'
    assert mask_secrets(None, ks.settings) is None and mask_secrets("x", None) == "x"


def test_a_failed_jobs_error_and_log_are_masked_in_status_registry_and_audit(ks):
    v = allocate(ks).version
    ks.registry.set_state(PIPELINE, v, "backfilling")
    fake_running(ks, v, state="failed", error=f"SourceError: SASL authentication failed ({SECRET})")
    ks.paths(PIPELINE, v).log_file.write_text(f"librdkafka config: sasl.password={SECRET}\n")
    st = inspect_version(ks.version(PIPELINE, v))
    assert st.failed and SECRET not in st.error and SECRET not in st.log_tail and "***" in st.log_tail
    assert mark_failed(ks, st, actor="tester")
    assert SECRET not in ks.registry.get_version(PIPELINE, v).error
    (entry,) = ks.registry.audit_log(PIPELINE, action="job_failed")
    assert SECRET not in json.dumps(entry.model_dump(mode="json"))


class _SleepUntilTheChildExits:
    """launch's `time`: its wait for an exit-at-once returns once the spawned process has exited."""

    def sleep(self, seconds: float) -> None:
        for proc in list(CHILDREN.values()):
            proc.wait(60)

    def __getattr__(self, name):
        return getattr(time, name)


def test_a_job_that_exits_at_once_is_reported_without_its_secret(ks, monkeypatch):
    def job_command(v, **_):
        return [sys.executable, "-c", f"print('connecting with sasl.password=' + {SECRET!r}); raise SystemExit(3)"], \
            "local"

    monkeypatch.setattr(launch, "job_command", job_command)
    monkeypatch.setattr(launch, "time", _SleepUntilTheChildExits())
    v = allocate(ks).version
    with pytest.raises(LifecycleError) as e:
        launch.start_version(ks.version(PIPELINE, v), actor="tester")
    assert "exited at once with code 3" in str(e.value) and "sasl.password=***" in str(e.value)
    assert SECRET not in str(e.value)
    assert SECRET not in json.dumps([a.model_dump(mode="json") for a in ks.registry.audit_log(PIPELINE)])
    assert SECRET not in (ks.registry.get_version(PIPELINE, v).error or "")
