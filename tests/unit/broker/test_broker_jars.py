"""The JAR sets and the embedded broker's plumbing, without Maven, a JVM or a broker.

The real fetch and the real broker run in every integration test (the session broker), and the
packaging test installs kappa without its checkout; these pin what those cannot show cheaply:
which JARs are pruned, the one-line errors, and that a SCRAM password never reaches a command line.
"""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from orchestrator.core import jars
from orchestrator.core.exceptions import BrokerError, ConfigError
from orchestrator.dev import broker as broker_mod
from orchestrator.dev.broker import SCRAM_MECHANISM, EmbeddedBroker


@pytest.mark.parametrize("jar, artifact", [
    ("jackson-core-2.21.2.jar", "jackson-core"),
    ("spark-tags_2.13-4.2.0.jar", "spark-tags_2.13"),
    ("delta-spark_4.2_2.13-4.4.0.jar", "delta-spark_4.2_2.13"),
    ("zstd-jni-1.5.7-7.jar", "zstd-jni"),
    ("javassist-3.30.2-GA.jar", "javassist"),
    ("kafka_2.13-4.2.0.jar", "kafka_2.13"),
    ("hadoop-client-runtime-3.5.0.jar", "hadoop-client-runtime"),
])
def test_artifact_names_drop_the_version(jar, artifact):
    assert jars.artifact_of(jar) == artifact


def test_every_set_has_a_pom_and_a_cache_folder_keyed_by_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name in jars.JAR_SETS:
        folder = jars.jar_dir(name)
        assert folder.parent == tmp_path / "kappa" / "jars" and folder.name.startswith(f"{name}-")
    assert jars.jar_dir("kafka") != jars.jar_dir("spark")


def test_a_set_never_fetched_is_one_line_naming_the_setup(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ConfigError) as e:
        jars.require_jars("kafka")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == (f"the JARs of the embedded Apache Kafka broker and Kafka's tools are missing "
                   f"({jars.jar_dir('kafka')} was never fetched): run `deploy/dev.sh setup` (it fetches "
                   f"them from Maven Central with mvn)")
    with pytest.raises(ConfigError, match="run `deploy/dev.sh setup`"):
        EmbeddedBroker(tmp_path / "b").start()
    assert not (tmp_path / "b").exists()


def _fake_mvn(tmp_path: Path, monkeypatch, names: list[str], *, fail: str | None = None) -> list[list[str]]:
    """`mvn` replaced by a function that writes empty JARs named `names` to the output folder."""
    calls: list[list[str]] = []

    def run(cmd, **kw):
        calls.append(cmd)
        if fail:
            return subprocess.CompletedProcess(cmd, 1, f"[ERROR] {fail}\n[ERROR] more\n", "")
        out = Path(next(a for a in cmd if a.startswith("-DoutputDirectory=")).split("=", 1)[1])
        for n in names:
            (out / n).write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(jars.shutil, "which", lambda _: "/usr/bin/mvn")
    monkeypatch.setattr(jars.subprocess, "run", run)
    return calls


def test_the_spark_set_drops_what_pyspark_ships_and_is_fetched_once(tmp_path, monkeypatch):
    import pyspark

    shipped = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("jackson-core-*.jar"))
    assert shipped, "pyspark ships jackson-core"
    calls = _fake_mvn(tmp_path, monkeypatch, ["jackson-core-2.13.5.jar", "delta-spark_4.2_2.13-4.4.0.jar",
                                               "spark-sql-kafka-0-10_2.13-4.2.0.jar", "kafka-clients-3.9.2.jar"])
    folder, fetched = jars.fetch_jars("spark", out=open("/dev/null", "w"))
    assert fetched and folder == jars.jar_dir("spark")
    assert sorted(p.name for p in folder.glob("*.jar")) == [
        "delta-spark_4.2_2.13-4.4.0.jar", "kafka-clients-3.9.2.jar", "spark-sql-kafka-0-10_2.13-4.2.0.jar"]
    assert jars.require_jars("spark") == folder
    assert jars.fetch_jars("spark") == (folder, False) and len(calls) == 1
    assert "dependency:copy-dependencies" in calls[0] and "-DincludeScope=runtime" in calls[0]


def test_a_failed_fetch_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch):
    _fake_mvn(tmp_path, monkeypatch, [], fail="Could not find artifact io.delta:delta-spark_4.2_2.13:jar:9.9")
    with pytest.raises(jars.JarsError) as e:
        jars.fetch_jars("spark")
    assert str(e.value) == ("cannot fetch Spark's Kafka connector and delta-spark from Maven Central: "
                            "Could not find artifact io.delta:delta-spark_4.2_2.13:jar:9.9")
    assert list((tmp_path / "kappa" / "jars").iterdir()) == []


def test_scram_users_are_formatted_through_a_0600_argument_file(tmp_path, monkeypatch):
    """The password goes to StorageTool in an `@file` (0600, deleted after), never in its argv."""
    seen: dict = {}
    monkeypatch.setattr("orchestrator.core.jars.require_jars", lambda name: tmp_path)

    def run(cmd, **kw):
        seen["cmd"] = cmd
        argfile = Path(cmd[-1][1:])
        seen["mode"] = stat.S_IMODE(argfile.stat().st_mode)
        seen["args"] = argfile.read_text().splitlines()
        return subprocess.CompletedProcess(cmd, 0, "Formatting metadata directory", "")

    monkeypatch.setattr(broker_mod.subprocess, "run", run)
    monkeypatch.setattr(broker_mod, "_java", lambda: "/usr/bin/java")
    b = EmbeddedBroker(tmp_path / "b", scram_users={"alice": "pa ss-w0rd"})
    b._format(tmp_path / "server.properties", "cluster-id")
    assert all("pa ss-w0rd" not in part for part in seen["cmd"])
    assert seen["cmd"][-2:] == ["kafka.tools.StorageTool", seen["cmd"][-1]] and seen["cmd"][-1].startswith("@")
    assert seen["mode"] == 0o600
    assert seen["args"] == ["format", "--standalone", "-t", "cluster-id", "-c", str(tmp_path / "server.properties"),
                            "--add-scram", f"{SCRAM_MECHANISM}=[name=alice,password=pa ss-w0rd]"]
    assert not Path(seen["cmd"][-1][1:]).exists()


def test_a_failing_tool_is_one_line_with_its_last_words(tmp_path, monkeypatch):
    monkeypatch.setattr("orchestrator.core.jars.require_jars", lambda name: tmp_path)
    monkeypatch.setattr(broker_mod, "_java", lambda: "/usr/bin/java")
    monkeypatch.setattr(broker_mod.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "Exception in thread main\nError: log dir is not empty\n"))
    with pytest.raises(BrokerError) as e:
        broker_mod.kafka_tool("kafka.tools.StorageTool", ["format"])
    assert str(e.value) == "Kafka's StorageTool failed: Error: log dir is not empty"


def test_a_failing_tool_s_stack_trace_gives_its_innermost_exception_not_a_frame(tmp_path, monkeypatch):
    """CI: "Kafka's StorageTool failed: at kafka.tools.StorageTool.main(StorageTool.scala)" said nothing."""
    trace = ('Exception in thread "main" java.lang.RuntimeException: could not format\n'
             "\tat kafka.tools.StorageTool$.formatCommand(StorageTool.scala:120)\n"
             "Caused by: java.nio.file.AccessDeniedException: /data/meta.properties\n"
             "\tat java.base/sun.nio.fs.UnixException.translateToIOException(UnixException.java:90)\n"
             "\t... 3 more\n\tat kafka.tools.StorageTool.main(StorageTool.scala)\n")
    monkeypatch.setattr("orchestrator.core.jars.require_jars", lambda name: tmp_path)
    monkeypatch.setattr(broker_mod, "_java", lambda: "/usr/bin/java")
    for err, said in [(trace, "Caused by: java.nio.file.AccessDeniedException: /data/meta.properties"),
                      ("\tat kafka.tools.StorageTool.main(StorageTool.scala)\n",
                       "at kafka.tools.StorageTool.main(StorageTool.scala)"), ("", "exit code 1")]:
        monkeypatch.setattr(broker_mod.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", err))
        with pytest.raises(BrokerError) as e:
            broker_mod.kafka_tool("kafka.tools.StorageTool", ["format"])
        assert str(e.value) == f"Kafka's StorageTool failed: {said}"


def test_the_broker_keeps_its_ports_and_refuses_one_taken(tmp_path):
    """A formatted folder brings back its recorded ports; a port another process holds is one line."""
    import socket

    data = tmp_path / "b"
    (data / "kraft").mkdir(parents=True)
    (data / "kraft" / "meta.properties").write_text("cluster.id=x\n")
    with socket.socket() as s, socket.socket() as c:
        for sock in (s, c):
            sock.bind(("127.0.0.1", 0))
        s.listen()
        taken, controller = s.getsockname()[1], c.getsockname()[1]
        # the controller's port: one the OS handed out and this test holds until the check below (a fixed
        # neighbour of `taken` may be anybody's, another test worker's broker included)
        (data / broker_mod.STATE_FILE).write_text(json.dumps({"port": taken, "controller_port": controller}))
        b = EmbeddedBroker(data)
        with pytest.raises(BrokerError) as e:
            b._plan()
        assert str(e.value) == (f"the embedded broker of {data} listens on 127.0.0.1:{taken} (plaintext), which "
                                f"another process holds now: stop that process, or start the broker with "
                                f"another folder")
    state = EmbeddedBroker(data)._plan()
    assert (state["port"], state["controller_port"]) == (taken, controller)


def test_properties_open_a_sasl_listener_only_with_scram_users(tmp_path):
    plain = EmbeddedBroker(tmp_path / "p", port=9, controller_port=10)
    text = plain._properties()
    assert "listeners=PLAINTEXT://127.0.0.1:9,CONTROLLER://127.0.0.1:10\n" in text
    assert "sasl.enabled.mechanisms" not in text and "log.cleaner.enable=true\n" in text
    sasl = EmbeddedBroker(tmp_path / "s", port=9, controller_port=10, sasl_port=11, scram_users={"u": "p"})
    text = sasl._properties()
    assert "advertised.listeners=PLAINTEXT://127.0.0.1:9,SASL_PLAINTEXT://127.0.0.1:11\n" in text
    assert f"sasl.enabled.mechanisms={SCRAM_MECHANISM}\n" in text and "password" not in text


def test_a_cluster_id_is_made_as_kafka_makes_it_without_a_jvm():
    """`kafka-storage random-uuid`'s format: a version-4 UUID in URL-safe base64 without padding, never
    starting with "-" (Kafka's `Uuid.randomUuid`); `kafka-storage format` takes it at every broker start."""
    import base64
    import uuid

    from orchestrator.dev.broker import random_cluster_id

    ids = {random_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    for text in ids:
        assert len(text) == 22 and not text.startswith("-") and "=" not in text, text
        assert uuid.UUID(bytes=base64.urlsafe_b64decode(text + "==")).version == 4
