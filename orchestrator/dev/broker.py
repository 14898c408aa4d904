"""The embedded broker: a single-node Apache Kafka (KRaft, combined broker and controller).

It runs from the JARs `deploy/dev.sh setup` fetched from Maven Central (`deploy/jars/kafka/pom.xml`)
as `java -cp ... kafka.Kafka server.properties`, bound to 127.0.0.1, with its data, settings and log
under one folder. Its storage is formatted once (`kafka.tools.StorageTool format --standalone`); a
later start on the same folder keeps its ports, topics and records, as a real cluster does. The log
cleaner runs, and checks for dirty logs every second (`log.cleaner.backoff.ms`), so topics created
with `FAST_COMPACTION` are compacted within seconds. A SASL/SCRAM listener opens beside the
plaintext one when SCRAM users are given; they are created by Kafka's StorageTool at format, with
their passwords in a 0600 argument file (`java @file`), never on a command line.

Production points kappa at its own cluster instead (`bootstrap_servers` and `kafka` settings).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core.exceptions import BrokerError
from orchestrator.core.net import free_port
from orchestrator.jobctl.process import stop_process

__all__ = ["EmbeddedBroker", "FAST_COMPACTION", "SCRAM_MECHANISM", "kafka_tool", "wait_for_broker"]

#: Topic settings of demo and test topics: the cleaner compacts a closed segment within seconds.
#: A segment closes when a record arrives more than `segment.ms` after the segment's first one;
#: the active segment is never cleaned. Tombstones stay readable `delete.retention.ms` after their
#: segment is cleaned. Production topics keep their own settings.
FAST_COMPACTION = {"cleanup.policy": "compact", "segment.ms": "1000", "min.cleanable.dirty.ratio": "0.01",
                   "min.compaction.lag.ms": "0", "delete.retention.ms": "60000"}
SCRAM_MECHANISM = "SCRAM-SHA-512"
STATE_FILE = "kappa-broker.json"

_LOG4J = """\
status = error
name = kappa-broker
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = STDOUT
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = INFO
"""


def _port_free(port: int) -> bool:
    """Whether the broker could listen on `port` (the JVM binds with SO_REUSEADDR, so a port whose
    last connections wait in TIME_WAIT after a stop is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


#: The JIT of the Kafka JVMs kappa starts (the embedded broker, Kafka's tools): C1 only. The broker serves a
#: demo, `kappa up`, the benchmarks and the tests, whose loads are short, and C2's compile threads cost more
#: CPU than they saved there (2026-12-01, alternated twice on 2 cores): start to ready 6.2-6.5 CPU-s with the
#: full JIT, 3.2 with C1 (4.7 -> 3.6 s); idle, 2.6 -> 1.9 CPU-s a minute; 400,000 changelog records produced
#: into it, 4.7-7.0 -> 3.0-3.2 CPU-s of the broker. Brokers took 12% of the test suite's CPU.
KAFKA_JIT = "-XX:TieredStopAtLevel=1"


def _java() -> str:
    from jobs.lib.runtime.jvm import find_java17

    home = find_java17()
    java = Path(home, "bin", "java") if home else None
    if java is None or not java.exists():
        raise BrokerError("the embedded Kafka broker needs Java 17: install openjdk-17 or set JAVA_HOME to it")
    return str(java)


def random_cluster_id() -> str:
    """A new KRaft cluster id, made as Kafka's `StorageTool random-uuid` makes it (`Uuid.randomUuid`: a
    random version-4 UUID in URL-safe base64 without padding, never one that starts with "-"), without a
    JVM start for it."""
    import base64
    import uuid

    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def kafka_tool(main_class: str, args: list[str], *, timeout: float = 120.0, secret_args: bool = False,
               jvm_jit: bool = False) -> str:
    """Run one of Kafka's own tools (a main class from the fetched JARs); its stdout, or BrokerError.

    Tools start with C1 only (they are short); `jvm_jit` keeps the full JIT for one that measures.
    With `secret_args`, the arguments go through a 0600 file named as `@file` (Kafka's tools parse
    arguments with argparse4j, which reads such a file one argument per line), so /proc shows no secret.
    """
    from orchestrator.core.jars import require_jars

    cp = str(require_jars("kafka") / "*")
    argfile = None
    if secret_args:
        fd, argfile = tempfile.mkstemp(prefix="kafka-args-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write("".join(f"{a}\n" for a in args))
        args = [f"@{argfile}"]
    try:
        jit = [] if jvm_jit else [KAFKA_JIT]
        done = subprocess.run([_java(), *jit, "-Xmx512m", "-Dlog4j2.level=error", "-cp", cp, main_class, *args],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BrokerError(f"Kafka's {main_class.rsplit('.', 1)[-1]} did not finish within {timeout:.0f}s") from None
    finally:
        if argfile:
            os.unlink(argfile)
    if done.returncode != 0:
        raise BrokerError(f"Kafka's {main_class.rsplit('.', 1)[-1]} failed: "
                          f"{_last_words(done.stderr or done.stdout) or f'exit code {done.returncode}'}")
    return done.stdout


def _last_words(output: str) -> str | None:
    """A failed tool's last line that says something: a Java stack trace's frames (``at ...``, ``... 3 more``)
    are left out, so a trace gives its innermost exception (CI saw "failed: at kafka.tools.StorageTool.main")."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.startswith("at ") and not re.fullmatch(r"\.\.\. \d+ more", ln)]
    return (said or lines or [None])[-1]


def wait_for_broker(bootstrap: str, timeout: float = 20.0, config: dict | None = None) -> None:
    """Block until the broker answers a metadata request, or raise BrokerError."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, **(config or {})})
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=2)
            return
        except Exception as e:  # KafkaException on connection refused / timeout
            last = e
            time.sleep(0.2)
    raise BrokerError(
        f"no Kafka broker answered a metadata request at {bootstrap} within {timeout:.0f}s "
        f"({last}); check that it is running and that bootstrap servers are right"
    )


@dataclass
class EmbeddedBroker:
    """An Apache Kafka node whose data, settings and log live in `data_dir`, stopped by its own PID.

    `port` 0 picks a free port at the first start; later starts on the same `data_dir` reuse the
    recorded ports (clients keep their bootstrap servers). `scram_users` (name -> password) opens a
    SASL_PLAINTEXT listener with SCRAM-SHA-512; they are created when the storage is formatted.
    `advertised_port` (0: `port`) is the plaintext port clients are told to connect to after their
    bootstrap request: a proxy's in front of the broker (the fault suite's Toxiproxy), so that every
    connection of a client goes through it. The controller listener stays direct.
    """

    data_dir: Path
    port: int = 0
    scram_users: dict[str, str] = field(default_factory=dict, repr=False)
    heap: str = "1g"
    controller_port: int = 0
    sasl_port: int = 0
    advertised_port: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap_servers(self) -> str:
        if not self.sasl_port:
            raise BrokerError("this embedded broker has no SASL listener: start it with scram_users")
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _state(self) -> dict:
        try:
            return json.loads((self.data_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return {}

    def _plan(self) -> dict:
        """Ports and cluster id: the recorded ones on a formatted folder, else new ones."""
        state = self._state()
        if state and (self.data_dir / "kraft" / "meta.properties").is_file():
            self.port = state["port"]
            self.controller_port = state["controller_port"]
            self.sasl_port = state.get("sasl_port") or 0
            for name, port in (("plaintext", self.port), ("controller", self.controller_port),
                               ("sasl", self.sasl_port)):
                if port and not _port_free(port):
                    raise BrokerError(f"the embedded broker of {self.data_dir} listens on 127.0.0.1:{port} "
                                      f"({name}), which another process holds now: stop that process, or "
                                      f"start the broker with another folder")
            return state
        self.port = self.port or free_port()
        self.controller_port = free_port()
        self.sasl_port = free_port() if self.scram_users else 0
        return {"port": self.port, "controller_port": self.controller_port, "sasl_port": self.sasl_port,
                "scram_users": sorted(self.scram_users)}

    def _properties(self) -> str:
        listeners = [f"PLAINTEXT://127.0.0.1:{self.port}"]
        advertised = [f"PLAINTEXT://127.0.0.1:{self.advertised_port or self.port}"]
        if self.sasl_port:
            listeners.append(f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}")
            advertised.append(f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}")
        props = {
            "process.roles": "broker,controller", "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": ",".join(listeners + [f"CONTROLLER://127.0.0.1:{self.controller_port}"]),
            "advertised.listeners": ",".join(advertised),
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
            "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir / "kraft"),
            "num.partitions": "1", "default.replication.factor": "1",
            "offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1", "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1", "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.cleaner.enable": "true", "log.cleaner.backoff.ms": "1000", "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
        }
        if self.sasl_port:
            props["sasl.enabled.mechanisms"] = SCRAM_MECHANISM
            props[f"listener.name.sasl_plaintext.{SCRAM_MECHANISM.lower()}.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;")
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def _format(self, config: Path, cluster_id: str) -> None:
        args = ["format", "--standalone", "-t", cluster_id, "-c", str(config)]
        for name, password in sorted(self.scram_users.items()):
            args += ["--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]"]
        kafka_tool("kafka.tools.StorageTool", args, secret_args=bool(self.scram_users))

    def start(self, timeout: float = 60.0) -> "EmbeddedBroker":
        if self.proc is not None:
            return self
        from orchestrator.core.jars import require_jars

        jars = require_jars("kafka")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        state = self._plan()
        config = self.data_dir / "server.properties"
        config.write_text(self._properties())
        (self.data_dir / "log4j2.properties").write_text(_LOG4J)
        if not (self.data_dir / "kraft" / "meta.properties").is_file():
            cluster_id = random_cluster_id()
            self._format(config, cluster_id)
            state["cluster_id"] = cluster_id
            (self.data_dir / STATE_FILE).write_text(json.dumps(state, indent=1))
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [_java(), f"-Xmx{self.heap}", "-Xms256m", "-XX:+UseG1GC", KAFKA_JIT, "-Djava.awt.headless=true",
                 f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                 f"-Dkafka.logs.dir={self.data_dir / 'logs'}",
                 "-cp", str(jars / "*"), "kafka.Kafka", str(config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        except OSError as e:
            raise BrokerError(f"cannot start the embedded Kafka broker: {e}") from None
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                code, self.proc = self.proc.returncode, None
                raise BrokerError(f"the embedded Kafka broker exited at start with code {code}: "
                                  f"{self._last_error()} (log {self.log_path})")
            if _listening(self.port):
                wait_for_broker(self.bootstrap_servers, max(5.0, deadline - time.monotonic()))
                return self
            time.sleep(0.1)
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"the embedded Kafka broker did not listen on {self.bootstrap_servers} "
                                  f"within {timeout:.0f}s (log {self.log_path})")

    def _last_error(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "no log"
        errors = [ln for ln in lines if " ERROR " in ln or "Exception" in ln]
        return (errors or lines or ["no log"])[-1][:300]

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker (a controlled shutdown, SIGKILL after `timeout`); its data stays."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        # An unreaped child keeps its PID, so no creation time is needed to know it is ours.
        stop_process(proc.pid, None, timeout)
        proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would: no controlled shutdown; its data stays."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
