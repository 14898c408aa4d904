"""Running a job to its end: signals, STOP file, heartbeat, graceful stop, final status."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from jobs.lib.kafka import checkpoint_offsets, commit_group_offsets, last_committed_batch
from jobs.lib.kafka.progress import backfill_reading
from jobs.lib.runtime.args import parse_args
from jobs.lib.runtime.backfill import clear_when_committed
from jobs.lib.runtime.context import JobContext, ProgressListener
from jobs.lib.runtime.status import RunState, Status, summarize_error
from jobs.lib.session import build_session
from orchestrator.core.envvars import KAPPA_STOP_GRACE_SECONDS
from orchestrator.core.exceptions import ConfigError

__all__ = ["HEARTBEAT_SECONDS", "run", "run_job"]

log = logging.getLogger("kappa.runtime")

HEARTBEAT_SECONDS = 2.0


def _setup_logging() -> None:
    root = logging.getLogger()
    if not any(getattr(h, "_kappa", False) for h in root.handlers):
        h = logging.StreamHandler(sys.stdout)
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        h._kappa = True  # type: ignore[attr-defined]
        root.addHandler(h)
    root.setLevel(logging.INFO)
    logging.getLogger("py4j").setLevel(logging.WARNING)


def _in_thread(fn: Callable[[], Any], timeout: float, what: str) -> None:
    """Run a best-effort call that may block on the network, for at most ``timeout`` seconds."""
    def target():
        try:
            fn()
        except Exception as e:
            log.warning("%s failed: %s", what, e)

    t = threading.Thread(target=target, name=what, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        log.warning("%s did not finish within %.0fs; going on", what, timeout)


def _graceful_stop(query: Any, grace: float) -> None:
    """Stop between micro-batches: wait for the running trigger to finish, then stop."""
    deadline = time.monotonic() + grace
    while query.isActive and time.monotonic() < deadline:
        try:
            active = bool(query.status.get("isTriggerActive"))
        except Exception:
            active = False
        if not active:
            break
        time.sleep(0.02)
    else:
        if query.isActive:
            log.warning("the running micro-batch did not finish within %.0fs; stopping it (it will be "
                        "replayed from the checkpoint)", grace)
    query.stop()


def run_job(build: Callable[[JobContext], Any], argv: list[str] | None = None) -> int:
    """Run one job to its end; returns the exit code (0 finished/stopped, 1 failed)."""
    _setup_logging()
    try:
        args = parse_args(argv)
    except ConfigError as e:
        log.error("%s", e)
        return 2
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    stop_file = run_dir / "STOP"
    _clear_stale_stop(stop_file)
    status = Status(run_dir / "status.json", args.pipeline, args.version, args.trigger)
    status.update()
    log.info("job %s v%s starting (pid %d, trigger %s, run dir %s)", args.pipeline, args.version,
             os.getpid(), args.trigger, run_dir)

    stop_event = threading.Event()
    finished_event = threading.Event()

    def on_signal(signum, frame):
        log.info("signal %s received: stopping after the current micro-batch", signum)
        stop_event.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, on_signal)
        except ValueError:  # not in the main thread (tests)
            pass

    def heartbeat():
        shown = False   # whether this thread put a backfill's read progress into the status
        while not finished_event.wait(HEARTBEAT_SECONDS):
            try:
                if stop_file.exists():
                    stop_event.set()
                reading = _backfill_reading(args.checkpoint)
                if reading is None:
                    clear_when_committed(args.checkpoint)
                if reading is not None or shown:
                    status.update(reading=reading)
                    shown = reading is not None
                else:
                    status.update()
            except Exception as e:
                log.warning("heartbeat could not write %s: %s", status.path, e)

    hb = threading.Thread(target=heartbeat, name="kappa-heartbeat", daemon=True)
    hb.start()

    spark = None
    listener = None
    query = None
    final: dict[str, Any] = {}
    code = 1
    try:
        spark = build_session(f"kappa-{args.pipeline}-v{args.version}", master=args.master,
                              local_dir=str(run_dir / "spark-local"))
        ctx = JobContext(args, spark, status)
        listener = ProgressListener()
        spark.streams.addListener(listener)
        if stop_file.exists() or stop_event.is_set():
            log.info("stop requested before the query started")
            final = {"state": RunState.STOPPED}
            code = 0
            return code
        query = build(ctx)
        if query is None or not hasattr(query, "awaitTermination"):
            raise ConfigError(f"build(ctx) of job {args.pipeline} must return a StreamingQuery, got {query!r}")
        listener.attach(ctx, str(query.id))
        status.update(state=RunState.RUNNING, query_id=str(query.id))
        log.info("query %s running", query.id)
        requested = False
        while query.isActive:
            if stop_event.is_set() or stop_file.exists():
                stop_event.set()
                requested = True
                status.update(state=RunState.STOPPING)
                log.info("stop requested: letting the current micro-batch finish")
                _graceful_stop(query, float(os.environ.get(KAPPA_STOP_GRACE_SECONDS, "120")))
                break
            try:
                query.awaitTermination(0.5)
            except Exception:
                break  # failed: reported below from query.exception()
        exc = query.exception()
        for p in query.recentProgress or []:
            ctx.on_progress(json.loads(p.json) if hasattr(p, "json") else dict(p))
        if exc is not None:
            raise exc
        final = {"state": RunState.STOPPED if requested or args.trigger != "available-now" else RunState.FINISHED}
        code = 0
    except BaseException as e:  # noqa: BLE001 - any failure must end as state failed
        if isinstance(e, SystemExit) and e.code in (0, None):
            final, code = {"state": RunState.STOPPED}, 0
        else:
            msg = _outage_error(e, args) or summarize_error(e)
            log.error("job failed: %s", msg)
            log.error("%s", "".join(traceback.format_exception(e)))
            final, code = {"state": RunState.FAILED, "error": msg}, 1
    finally:
        if query is not None:
            try:
                if query.isActive:
                    query.stop()
            except Exception:
                pass
        _finish_offsets(args, status)
        if spark is not None:
            if listener is not None:
                try:
                    spark.streams.removeListener(listener)
                except Exception:
                    pass
            _in_thread(spark.stop, 60, "stopping Spark")
        finished_event.set()
        hb.join(5)
        status.update(**final)
        log.info("job %s v%s %s (exit %d)", args.pipeline, args.version, final.get("state"), code)
    return code


def _outage_error(e: BaseException, args: argparse.Namespace) -> str | None:
    """The one-line ``broker unavailable`` error of a query on Spark's Kafka source that failed because
    the broker did not answer (`jobs.lib.runtime.stream.broker_unavailable`); None for anything else."""
    from jobs.lib.runtime.stream import broker_unavailable, outage_seconds

    text = "\n".join(str(x) for x in (e, getattr(e, "_stackTrace", ""), getattr(e, "_cause", "")) if x)
    try:
        seconds = outage_seconds((args.extra or {}).get("source_options"))
    except Exception:  # noqa: BLE001 - a bad option failed the job before anything was read
        return None
    return broker_unavailable(text, args.bootstrap_servers, seconds)


def _backfill_reading(checkpoint: str) -> dict | None:
    """Read progress of a one-batch backfill for the status (`jobs.lib.kafka.progress`, written by the
    seed jobs' reader tasks and standardize's stage tasks alike); None when nothing reports it."""
    try:
        return backfill_reading(checkpoint)
    except Exception as e:  # noqa: BLE001 - progress is a courtesy
        log.debug("no read progress: %s", e)
        return None


def _clear_stale_stop(stop_file: Path) -> None:
    """A STOP file older than this process is left from an earlier run of the version (a restart
    from its checkpoint, say): it must not stop this one."""
    try:
        import psutil

        born = psutil.Process().create_time()
        if stop_file.exists() and stop_file.stat().st_mtime < born - 1:
            stop_file.unlink()
            log.info("removed a STOP file left by an earlier run: %s", stop_file)
    except (OSError, ImportError) as e:
        log.warning("cannot check %s for a stale STOP file: %s", stop_file, e)


def _finish_offsets(args: argparse.Namespace, status: Status) -> None:
    """Record the last committed batch from the checkpoint and commit it to the consumer group."""
    try:
        end = checkpoint_offsets(args.checkpoint)
        last = last_committed_batch(args.checkpoint)
    except Exception as e:
        log.warning("cannot read the checkpoint %s: %s", args.checkpoint, e)
        return
    if end is None:
        return
    status.update(end_offsets=end, batch_id=last)
    if args.group_id:
        _in_thread(lambda: commit_group_offsets(args.bootstrap_servers, args.group_id, end,
                                                args.kafka_config), 15, "committing offsets to the consumer group")


def run(build: Callable[[JobContext], Any], argv: list[str] | None = None) -> None:
    """Entry point of every job module: ``if __name__ == "__main__": run(build)``."""
    code = run_job(build, argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
