"""The plain live pipeline (`orchestrator.dev.plainspark.start_plain_live_query`) in a process of its own.

`kappa bench freshness` measures kappa's served table against it in the same run: `PlainLive.start`
runs ``python -m orchestrator.dev.plainlive PARAMS_JSON`` (a fresh driver and JVM, started like a
version's job: `spark_env`, `build_session`, Spark's event log in the folder given), `wait_table`
waits for its first batch (the log so far, appended) to make the table, and `stop` asks it to stop
(a STOP file, as kappa's jobs are asked), then ends its process group by PID.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.core.exceptions import ConfigError, LifecycleError

__all__ = ["PlainLive", "main"]

STOP_WAIT = 60.0


class PlainLive:
    """The plain live pipeline's process (module docstring)."""

    def __init__(self, work: Path, bootstrap: str, topic: str, interval_seconds: float):
        self.work = Path(work)
        self.output, self.events = self.work / "out", self.work / "spark-events"
        self.stop_file, self.log = self.work / "STOP", self.work / "plain-live.log"
        self.params = {"bootstrap": bootstrap, "topic": topic, "output": str(self.output),
                       "checkpoint": str(self.work / "checkpoint"), "interval_seconds": interval_seconds,
                       "local_dir": str(self.work / "spark-local"), "stop_file": str(self.stop_file)}
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> "PlainLive":
        from orchestrator.core.envvars import KAPPA_SPARK_EVENT_LOG_DIR
        from orchestrator.dev.benchjob import child_env

        self.work.mkdir(parents=True, exist_ok=True)
        self.events.mkdir(exist_ok=True)
        pfile = self.work / "plain-live.params.json"
        pfile.write_text(json.dumps(self.params), encoding="utf-8")
        env, root = child_env(**{KAPPA_SPARK_EVENT_LOG_DIR: str(self.events)})
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator.dev.plainlive", str(pfile)],
                                         stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root,
                                         start_new_session=True)
        return self

    def _failed(self) -> LifecycleError:
        tail = " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-6:])[-1500:]
        return LifecycleError(f"the plain reference pipeline exited with {self.proc.returncode}: {tail} "
                              f"(its log: {self.log})")

    def wait_table(self, deadline_seconds: float) -> None:
        """Until the first batch made the table (LifecycleError if the process ends or the deadline passes)."""
        end = time.monotonic() + deadline_seconds
        while not (self.output / "_delta_log" / "00000000000000000000.json").exists():
            if self.proc.poll() is not None:
                raise self._failed()
            if time.monotonic() > end:
                raise LifecycleError(f"the plain reference pipeline made no table in {deadline_seconds:g} s "
                                     f"(its log: {self.log})")
            time.sleep(0.2)

    def stop(self) -> None:
        """Ask the process to stop (its STOP file), then end its group by PID."""
        from orchestrator.jobctl.process import end_group

        if self.proc is None:
            return
        self.stop_file.touch()
        try:
            self.proc.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        end_group(self.proc.pid, 10.0)


def main(argv: list[str] | None = None) -> int:
    """`python -m orchestrator.dev.plainlive PARAMS_JSON` (started by `PlainLive.start`)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise ConfigError("usage: python -m orchestrator.dev.plainlive PARAMS_JSON")
    p: dict[str, Any] = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    from jobs.lib.runtime.session import build_session
    from orchestrator.dev.plainspark import start_plain_live_query

    spark = build_session("kappa-bench-plain-live", local_dir=p["local_dir"],
                          extra={"spark.ui.showConsoleProgress": "false"})
    try:
        query = start_plain_live_query(spark, p["bootstrap"], p["topic"], p["output"], p["checkpoint"],
                                       float(p["interval_seconds"]))
        stop = Path(p["stop_file"])
        while not stop.exists() and not query.awaitTermination(0.5):
            pass
        failed = query.exception()
        query.stop()
    finally:
        spark.stop()
    if failed is not None:
        print(f"the plain live query failed: {failed}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
