"""The process runtime every kappa job shares: arguments, Spark, status file, graceful stop.

A job module is::

    from jobs.lib.runtime import JobContext, run

    def build(ctx: JobContext):
        df = ctx.read_stream()                      # the Kafka source, options from the arguments
        return (df.writeStream.foreachBatch(...)    # call ctx.record_batch(...) in there
                .option("checkpointLocation", ctx.args.checkpoint)
                .trigger(**ctx.trigger_kwargs()).start())

    if __name__ == "__main__":
        run(build)

and runs as ``python -m jobs.<name> --pipeline P --version N --bootstrap-servers B --topics t1,t2
--output PATH --rejects PATH --checkpoint PATH --run-dir PATH --group-id G [--rules FILE]
[--max-records-per-batch 100000] [--trigger available-now|continuous] [--interval-seconds 1]
[--kafka-config JSON] [--master URL] [--extra JSON]``.

What the runtime guarantees, so the orchestrator can watch and steer any job the same way:

* ``<run-dir>/status.json`` is replaced atomically (tmp file + ``os.replace``) when the job starts,
  after every micro-batch and on a 2 s heartbeat: ``pipeline, version, pid, state, started_at,
  heartbeat_at, batch_id, batches, rows_in, rows_out, rejects, rejects_total, end_offsets, error,
  rules_hash`` (plus ``query_id``, ``trigger``). ``state`` goes ``starting -> running`` and ends in
  ``finished`` (available-now reached its end offsets; exit 0), ``stopped`` (``<run-dir>/STOP``
  appeared or SIGTERM/SIGINT; ``stopping`` while the current micro-batch completes; exit 0) or
  ``failed`` (``error`` set; exit 1). ``rows_in/rows_out/rejects`` are totals since this process
  started; ``rejects_total`` is the output's cumulative reject count when the job reports it.
* Batch completion is tracked by a StreamingQueryListener (batch id, input rows, end offsets of
  each completed micro-batch); a job refines the counts from its foreachBatch function with
  ``ctx.record_batch(batch_id, rows_in, rows_out, rejects, rejects_total=None)``, and sets
  ``ctx.rules_hash`` when it applies rules.
* A graceful stop waits for the running micro-batch to finish (up to KAPPA_STOP_GRACE_SECONDS,
  default 120) before stopping the query, so nothing is left half-done; an interrupted batch would
  be replayed from the checkpoint anyway, idempotently.
* A STOP file older than the process (left by an earlier run of the version) is removed at
  start, so a version restarted from its checkpoint does not stop at once.
* When the job ends, the end offsets of the last committed micro-batch are committed once more
  to the consumer group (the source commits after every batch; this closes the last gap).
* Logs go to stdout (the launcher redirects them to ``<run-dir>/job.log``). Spark scratch space
  is ``<run-dir>/spark-local``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from orchestrator.core.exceptions import ConfigError, KappaError

log = logging.getLogger("kappa.runtime")

HEARTBEAT_SECONDS = 2.0
STATES = ("starting", "running", "stopping", "stopped", "finished", "failed")


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------

def _json_object(what: str):
    def parse(raw: str) -> dict:
        try:
            v = json.loads(raw)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"{what} must be a JSON object: {e}") from None
        if not isinstance(v, dict):
            raise argparse.ArgumentTypeError(f"{what} must be a JSON object, got {type(v).__name__}")
        return v
    return parse


def _positive(kind):
    def parse(raw: str):
        try:
            v = kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {raw!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {raw!r}")
        return v
    return parse


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="A kappa streaming job (one pipeline version).")
    p.add_argument("--pipeline", required=True)
    p.add_argument("--version", required=True, type=int)
    p.add_argument("--bootstrap-servers", required=True)
    p.add_argument("--topics", required=True, help="comma-separated")
    p.add_argument("--output", required=True, help="output Delta table path")
    p.add_argument("--rejects", default=None, help="rejects Delta table path (default <output>__rejects)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--group-id", default=None, help="consumer group (default kappa.<pipeline>.v<version>)")
    p.add_argument("--rules", default=None)
    p.add_argument("--max-records-per-batch", type=_positive(int), default=100_000)
    p.add_argument("--trigger", choices=("available-now", "continuous"), default="continuous")
    p.add_argument("--interval-seconds", type=_positive(float), default=1.0)
    p.add_argument("--kafka-config", type=_json_object("--kafka-config"), default={})
    p.add_argument("--master", default=None)
    p.add_argument("--extra", type=_json_object("--extra"), default={},
                   help='job-specific options; "source_options" (object) is passed to the Kafka source')
    return p


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    args = build_parser(prog).parse_args(argv)
    args.topics_list = [t.strip() for t in args.topics.split(",") if t.strip()]
    if not args.topics_list:
        raise ConfigError("--topics must name at least one topic")
    if args.rejects is None:
        args.rejects = args.output.rstrip("/") + "__rejects"
    if args.group_id is None:
        args.group_id = f"kappa.{args.pipeline}.v{args.version}"
    return args


# --------------------------------------------------------------------------------------------
# Status file
# --------------------------------------------------------------------------------------------

def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_status(run_dir: str | Path) -> dict | None:
    """The job's last status, or None if it has not written one (or it cannot be parsed)."""
    try:
        return json.loads(Path(run_dir, "status.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class Status:
    """The in-memory status of the job; every change is written through to status.json."""

    def __init__(self, path: Path, pipeline: str, version: int, trigger: str):
        self.path = path
        self._lock = threading.RLock()
        self.data: dict[str, Any] = {
            "pipeline": pipeline, "version": version, "pid": os.getpid(), "state": "starting",
            "started_at": time.time(), "heartbeat_at": time.time(), "batch_id": None, "batches": 0,
            "rows_in": 0, "rows_out": 0, "rejects": 0, "rejects_total": None, "end_offsets": None,
            "error": None, "rules_hash": None, "query_id": None, "trigger": trigger,
        }

    def update(self, **fields) -> None:
        with self._lock:
            self.data.update(fields)
            self.data["heartbeat_at"] = time.time()
            write_json_atomic(self.path, self.data)

    def get(self, key: str):
        with self._lock:
            return self.data.get(key)


# --------------------------------------------------------------------------------------------
# Job context
# --------------------------------------------------------------------------------------------

class JobContext:
    """What a job's ``build(ctx)`` gets: arguments, the SparkSession, the source, the status."""

    def __init__(self, args: argparse.Namespace, spark, status: Status, stop_event: threading.Event):
        self.args = args
        self.spark = spark
        self.status = status
        self.run_dir = Path(args.run_dir)
        self.extra: dict = dict(args.extra or {})
        self._stop_event = stop_event
        self._lock = threading.Lock()
        self._reported: dict[int, tuple[int, int, int]] = {}
        self._counted_batches: set[int] = set()
        self._rules_hash: str | None = None

    @property
    def rules_hash(self) -> str | None:
        return self._rules_hash

    @rules_hash.setter
    def rules_hash(self, value: str | None) -> None:
        self._rules_hash = value
        self.status.update(rules_hash=value)

    @property
    def stop_requested(self) -> bool:
        return self._stop_event.is_set()

    def source_options(self, topics: list[str] | str | None = None) -> dict[str, str]:
        """The Kafka source options the arguments imply (see jobs.lib.kafka)."""
        if topics is None:
            topics = self.args.topics_list
        if not isinstance(topics, str):
            topics = ",".join(topics)
        opts = {
            "bootstrap.servers": self.args.bootstrap_servers,
            "topics": topics,
            "group.id": self.args.group_id,
            "max.records.per.batch": str(self.args.max_records_per_batch),
        }
        try:
            opts["min.partitions"] = str(max(1, int(self.spark.sparkContext.defaultParallelism)))
        except Exception:
            pass
        for k, v in (self.args.kafka_config or {}).items():
            opts[f"kafka.{k}"] = str(v)
        for k, v in (self.extra.get("source_options") or {}).items():
            opts[str(k)] = v if isinstance(v, str) else json.dumps(v)
        return opts

    def read_stream(self, topics: list[str] | str | None = None):
        """A streaming DataFrame over ``topics`` (default: all of ``--topics``); schema in the contract."""
        reader = self.spark.readStream.format("kappa_kafka")
        for k, v in self.source_options(topics).items():
            reader = reader.option(k, v)
        return reader.load()

    def trigger_kwargs(self) -> dict:
        """Keyword arguments for ``DataStreamWriter.trigger`` from ``--trigger``/``--interval-seconds``."""
        if self.args.trigger == "available-now":
            return {"availableNow": True}
        return {"processingTime": f"{max(1, int(round(self.args.interval_seconds * 1000)))} milliseconds"}

    def record_batch(self, batch_id: int, rows_in: int, rows_out: int, rejects: int = 0,
                     rejects_total: int | None = None) -> None:
        """Called by the job (from foreachBatch, on the driver) once a batch's output is written.

        Re-reporting a batch replaces its counts. Writes status.json at once.
        """
        batch_id = int(batch_id)
        with self._lock:
            old = self._reported.get(batch_id, (0, 0, 0))
            new = (int(rows_in), int(rows_out), int(rejects))
            self._reported[batch_id] = new
            d = self.status.data
            fields: dict[str, Any] = {"rows_out": d["rows_out"] + new[1] - old[1],
                                      "rejects": d["rejects"] + new[2] - old[2]}
            if batch_id not in self._counted_batches:  # else the listener counted its input already
                fields["rows_in"] = d["rows_in"] + new[0] - old[0]
            if rejects_total is not None:
                fields["rejects_total"] = int(rejects_total)
            self.status.update(**fields)

    def _on_progress(self, progress: dict) -> None:
        """A completed micro-batch, from the listener or the query's recent progress."""
        try:
            batch_id = int(progress.get("batchId"))
        except (TypeError, ValueError):
            return
        ran = "addBatch" in (progress.get("durationMs") or {}) or (progress.get("numInputRows") or 0) > 0
        with self._lock:
            if batch_id in self._counted_batches or not ran:
                return
            self._counted_batches.add(batch_id)
            d = self.status.data
            fields: dict[str, Any] = {"batch_id": batch_id if d["batch_id"] is None else max(batch_id, d["batch_id"]),
                                      "batches": d["batches"] + 1}
            if batch_id not in self._reported:
                fields["rows_in"] = d["rows_in"] + int(progress.get("numInputRows") or 0)
            end = _source_end_offsets(progress)
            if end is not None and fields["batch_id"] == batch_id:
                fields["end_offsets"] = end
            self.status.update(**fields)


def _source_end_offsets(progress: dict) -> dict | None:
    """The kappa Kafka sources' end offsets in a progress report, merged into one offset JSON."""
    from jobs.lib.kafka import map_to_offsets, offsets_to_map

    merged: dict = {}
    found = False
    for src in progress.get("sources") or []:
        end = src.get("endOffset")
        if isinstance(end, str):
            try:
                end = json.loads(end)
            except ValueError:
                continue
        try:
            m = offsets_to_map(end)
        except KappaError:
            continue
        if not m:
            continue
        found = True
        for tp, o in m.items():
            merged[tp] = min(o, merged.get(tp, o))
    return map_to_offsets(merged) if found else None


def _listener_class():
    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressListener(StreamingQueryListener):
        """Forwards the progress of the job's query to its context (runs on a py4j thread)."""

        def __init__(self):
            self.ctx: JobContext | None = None
            self.query_id: str | None = None
            self.buffer: list[dict] = []
            self.lock = threading.Lock()

        def attach(self, ctx: JobContext, query_id: str) -> None:
            with self.lock:
                self.ctx, self.query_id = ctx, query_id
                pending, self.buffer = self.buffer, []
            for p in pending:
                if p.get("id") == query_id:
                    ctx._on_progress(p)

        def onQueryStarted(self, event) -> None:
            pass

        def onQueryProgress(self, event) -> None:
            try:
                p = json.loads(event.progress.json)
            except Exception:
                return
            with self.lock:
                if self.ctx is None:
                    self.buffer.append(p)
                    return
                ctx, qid = self.ctx, self.query_id
            if p.get("id") == qid:
                try:
                    ctx._on_progress(p)
                except Exception:
                    log.exception("could not record batch progress")

        def onQueryIdle(self, event) -> None:
            pass

        def onQueryTerminated(self, event) -> None:
            pass

    return ProgressListener


# --------------------------------------------------------------------------------------------
# Running a job
# --------------------------------------------------------------------------------------------

_KAPPA_ERR = re.compile(r"(?:orchestrator\.exceptions\.|\b)((?:[A-Z]\w*)?(?:Error|Exception)): (.+)")


def summarize_error(e: BaseException) -> str:
    """One line a person can act on: a kappa error's own message, else the deepest cause."""
    if isinstance(e, KappaError):
        return f"{type(e).__name__}: {e}"
    text = str(e)
    kappa = re.findall(r"orchestrator\.exceptions\.(\w+): (.+)", text)
    if kappa:
        name, msg = kappa[-1]
        return f"{name}: {msg.strip()}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        m = _KAPPA_ERR.search(ln)
        if m and not ln.startswith("at "):
            return f"{m.group(1)}: {m.group(2)}"[:2000]
    first = lines[0] if lines else type(e).__name__
    return f"{type(e).__name__}: {first}"[:2000]


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


def _graceful_stop(query, status: Status, grace: float) -> None:
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
        while not finished_event.wait(HEARTBEAT_SECONDS):
            try:
                if stop_file.exists():
                    stop_event.set()
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
        from jobs.lib.session import build_session

        spark = build_session(f"kappa-{args.pipeline}-v{args.version}", master=args.master,
                              local_dir=str(run_dir / "spark-local"))
        ctx = JobContext(args, spark, status, stop_event)
        listener = _listener_class()()
        spark.streams.addListener(listener)
        if stop_file.exists() or stop_event.is_set():
            log.info("stop requested before the query started")
            final = {"state": "stopped"}
            code = 0
            return code
        query = build(ctx)
        if query is None or not hasattr(query, "awaitTermination"):
            raise ConfigError(f"build(ctx) of job {args.pipeline} must return a StreamingQuery, got {query!r}")
        listener.attach(ctx, str(query.id))
        status.update(state="running", query_id=str(query.id))
        log.info("query %s running", query.id)
        requested = False
        while query.isActive:
            if stop_event.is_set() or stop_file.exists():
                stop_event.set()
                requested = True
                status.update(state="stopping")
                log.info("stop requested: letting the current micro-batch finish")
                _graceful_stop(query, status, float(os.environ.get("KAPPA_STOP_GRACE_SECONDS", "120")))
                break
            try:
                query.awaitTermination(0.5)
            except Exception:
                break  # failed: reported below from query.exception()
        exc = query.exception()
        for p in query.recentProgress or []:
            ctx._on_progress(json.loads(p.json) if hasattr(p, "json") else dict(p))
        if exc is not None:
            raise exc
        final = {"state": "stopped" if requested or args.trigger != "available-now" else "finished"}
        code = 0
    except BaseException as e:  # noqa: BLE001 - any failure must end as state "failed"
        if isinstance(e, SystemExit) and e.code in (0, None):
            final, code = {"state": "stopped"}, 0
        else:
            msg = summarize_error(e)
            log.error("job failed: %s", msg)
            log.error("%s", "".join(traceback.format_exception(e)))
            final, code = {"state": "failed", "error": msg}, 1
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
    from jobs.lib.kafka import checkpoint_offsets, commit_group_offsets, last_committed_batch

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
