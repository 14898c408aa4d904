"""A private PostgreSQL server for one test module, which a fault test may stop and start at will.

The machine's PostgreSQL (127.0.0.1:5432) serves every other test at the same time, so a fault test
never touches it: it runs Debian's binaries (`/usr/lib/postgresql/<ver>/bin`) on a data folder of
its own (initdb, trust auth), listening on 127.0.0.1 on a free port, its unix socket in its own
folder. PostgreSQL refuses to run as root: as root, the binaries run as the `postgres` OS user
(`runuser`) on a folder that user owns. The server is stopped by its postmaster PID (SIGINT: a fast
shutdown) at the end, and its folder deleted.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator.core.net import free_port

__all__ = ["PrivatePostgres"]


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[4]))
    if not found:
        pytest.fail("the fault suite needs Debian's PostgreSQL binaries (/usr/lib/postgresql/<ver>/bin/pg_ctl): "
                    "run `deploy/dev.sh test`, which installs `postgresql`, or `apt-get install -y postgresql`")
    return Path(found[-1]).parent


class PrivatePostgres:
    """initdb + pg_ctl on a temp folder; `stop()` / `start()` / `restart()` for the faults."""

    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="kappa-fault-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.log = self.root / "postgres.log"
        self._user: list[str] = []
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                pytest.fail("running as root, the private PostgreSQL needs the `postgres` OS user (Debian's "
                            "`postgresql` package creates it): `apt-get install -y postgresql`")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self._user = ["runuser", "-u", "postgres", "--"]
        self._run("mkdir", "-p", str(self.socket_dir))
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")

    def _run(self, *argv: str) -> None:
        done = subprocess.run([*self._user, *argv], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database}"

    @property
    def pid(self) -> int | None:
        """The postmaster's PID (its postmaster.pid file), None while it is down."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def start(self) -> float:
        """Start the server and wait until it takes connections; the seconds that took."""
        t0 = time.monotonic()
        opts = f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(str(self.bin / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log),
                  "-o", opts)
        return time.monotonic() - t0

    def stop(self) -> float:
        """A fast shutdown (every session ended, as on a restart); the seconds that took."""
        t0 = time.monotonic()
        self._run(str(self.bin / "pg_ctl"), "stop", "-w", "-t", "60", "-m", "fast", "-D", str(self.data))
        return time.monotonic() - t0

    def restart(self) -> float:
        return self.stop() + self.start()

    def create_database(self, name: str) -> str:
        import sqlalchemy as sa

        engine = sa.create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as c:
                c.execute(sa.text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()
        return self.url(name)

    def close(self) -> None:
        """Stop the server by its postmaster PID (SIGINT: fast shutdown) and delete its folder."""
        pid = self.pid
        if pid is not None:
            try:
                os.kill(pid, signal.SIGINT)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    os.kill(pid, 0)
                    time.sleep(0.1)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)
