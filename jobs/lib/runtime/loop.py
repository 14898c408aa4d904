"""Running a job to its end: signals, STOP file, heartbeat, a stop that stops, final status.

A stop is asked by the STOP file in the run directory (what kappa writes; it names who asked, why, and
the bound of the stop) or by SIGTERM/SIGINT. From then on no new micro-batch does any work (the stop
gate, `jobs.lib.runtime.stopping`): the batch in flight finishes and commits, then the query stops.
A second signal after the request (kappa sends SIGTERM at the stop's bound, and Ctrl-C twice does the
same) stops the query at once: the batch in flight is interrupted, and runs again from the checkpoint
at the next start, idempotently. Either way the job ends `stopped`, saying which.
"""

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

from jobs.lib.runtime.args import parse_args
from jobs.lib.runtime.backfill import clear_when_committed
from jobs.lib.runtime.context import JobContext, ProgressListener
from jobs.lib.runtime.session import build_session
from jobs.lib.runtime.status import RunState, Status, summarize_error
from jobs.lib.runtime.stopping import GATE
from jobs.lib.source.checkpoint import checkpoint_offsets, last_committed_batch
from jobs.lib.source.consumer_groups import commit_group_offsets
from jobs.lib.source.read_progress import backfill_reading
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


def _stop_asked(stop_file: Path, signals: list[int]) -> str:
    """Who asked for the stop: the STOP file's line (kappa writes who, when, the bound and why), or the signal."""
    try:
        text = stop_file.read_text(encoding="utf-8").strip()
    except OSError:
        text = ""
    if text:
        return text
    return f"stop requested by signal {signal.Signals(signals[0]).name}" if signals else "stop requested"


def _stop_after_batch(query: Any, now: threading.Event) -> str:
    """Stop the query once the micro-batch in flight has committed; no new one does work meanwhile (the
    gate). `now` set (a second signal): stop at once, interrupting the batch. Returns how it ended."""
    refused = "after micro-batch {last}; micro-batch {refused} was not started"
    while query.isActive:
        if GATE.refused is not None:
            return refused.format(last=GATE.last_done, refused=GATE.refused)
        if now.is_set():
            batch = GATE.in_flight
            log.warning("stopping now (a second stop signal: kappa's stop bound, or Ctrl-C twice)%s",
                        "" if batch is None else f": micro-batch {batch} is interrupted; it runs again from the "
                                                 f"checkpoint at the next start")
            query.stop()
            return "at once" + ("" if batch is None else f", micro-batch {batch} interrupted")
        try:
            active = bool(query.status.get("isTriggerActive"))
        except Exception:  # noqa: BLE001 - the query is ending
            active = False
        if not active and GATE.in_flight is None:
            query.stop()          # a batch that starts meanwhile meets the gate: it does nothing
            return "between micro-batches" + ("" if GATE.last_done is None else f", after micro-batch {GATE.last_done}")
        time.sleep(0.05)
    if GATE.refused is not None:     # the refusal ended the query before this loop looked
        return refused.format(last=GATE.last_done, refused=GATE.refused)
    return "the query had ended" + ("" if GATE.last_done is None else f", after micro-batch {GATE.last_done}")


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
    now_event = threading.Event()      # a second request: stop at once
    finished_event = threading.Event()
    GATE.reset()

    signals: list[int] = []

    def on_signal(signum, frame):
        if stop_event.is_set() or stop_file.exists():
            now_event.set()
        signals.append(signum)
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
        requested, ended = False, None
        while query.isActive:
            if stop_event.is_set() or stop_file.exists():
                stop_event.set()
                requested = True
                GATE.request()
                asked = time.monotonic()
                status.update(state=RunState.STOPPING)
                batch = GATE.in_flight
                log.info("%s; %s, and no new micro-batch starts", _stop_asked(stop_file, signals),
                         "no micro-batch in flight" if batch is None else f"micro-batch {batch} in flight finishes")
                ended = _stop_after_batch(query, now_event)
                log.info("query stopped %s, %.1f s after the request", ended, time.monotonic() - asked)
                break
            try:
                query.awaitTermination(0.5)
            except Exception:
                break  # failed: reported below from query.exception()
        if query.isActive:   # a stop requested after a failure broke the wait: it ends here
            query.stop()
        exc = query.exception()
        for p in query.recentProgress or []:
            ctx.on_progress(json.loads(p.json) if hasattr(p, "json") else dict(p))
        if exc is not None and not (requested and (GATE.refused is not None or now_event.is_set())):
            raise exc
        if exc is not None and GATE.refused is not None:
            log.info("micro-batch %d was not started: stop requested (Spark logs that as the query's error above); "
                     "it runs from the checkpoint at the next start", GATE.refused)
        final = {"state": RunState.STOPPED if requested or args.trigger != "available-now" else RunState.FINISHED}
        if requested:
            final["stopped"] = ended
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
    """Read progress of a one-batch backfill for the status (`jobs.lib.source.read_progress`, written by the
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
