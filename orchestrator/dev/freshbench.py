"""`kappa bench freshness`: how long after a record is produced its value is readable through the alias.

On the demo's embedded stack in a temporary home: fill a compacted profiles topic, deploy a
standardize version (its job runs with the live, processing-time trigger, as every deploy does),
wait until it is ready and promote it. Then a live producer updates member profiles at a steady
`rate` for `seconds`; each update gives its member a unique `location` ("probe-<run>-<n>"). A
reader polls the alias as any reader would (the published pointer, then the Delta table it names,
reloaded when the table's version changes) and notes when each probe's value is readable. The
latency of a probe is from just before `produce()` to the poll that first saw it, so it is
over-estimated by at most one poll interval plus one table read.

Two references: the job's trigger interval (p50 over the interval says how many triggers a record
waits), and a plain Spark pipeline measured after kappa's phase in the same run, kappa's job stopped
first: Kafka source, ``from_json``, the latest row per key, Delta's MERGE from ``foreachBatch`` at the
same trigger interval, no kappa code (`orchestrator.dev.plainlive`), read straight from its table by
the same reader with new probes from the same producer (`--no-reference` leaves it out). A probe overwritten by a later probe of the same member before it was seen is
counted as superseded (never readable, not a loss); one still unseen `drain` seconds after the
producer stopped is counted as unseen. Everything started (broker, job, producer) is stopped by
PID at the end; a temporary home is deleted, one given with `--home` is kept.
"""

from __future__ import annotations

import shutil
import threading
import time
from typing import Any

from orchestrator.core.exceptions import ConfigError, LifecycleError
from orchestrator.dev.benchutil import fmt_seconds, percentile, positive, ratio, write_figures

__all__ = ["validate_freshness", "trigger_interval", "freshness_figures", "freshness_lines", "Probes", "produce_probes", "poll_alias",
           "poll_table", "follow_probes", "reference_lines", "run_freshness_bench"]

PROBE_COLUMN = "location"


def validate_freshness(seconds: float, rate: float, poll: float, drain: float, records: int, keys: int) -> None:
    """ConfigError (one line, naming the option) for settings the benchmark cannot run with."""
    positive(seconds, "--seconds")
    positive(rate, "--rate")
    positive(poll, "--poll")
    positive(drain, "--drain")
    if rate > 5000:
        raise ConfigError(f"--rate {rate:g} is above 5000 updates/s: a freshness probe needs a steady producer "
                          f"the job can follow; give a lower rate")
    if keys < 1 or records < keys:
        raise ConfigError(f"--keys must be between 1 and --records ({records:,}), got {keys:,}")


def trigger_interval(command: list[str] | None) -> float:
    """The job's processing-time trigger interval from its launch command (the runtime's default
    when the command does not give --interval-seconds)."""
    from jobs.lib.runtime.args import build_parser

    cmd = list(command or [])
    if "--trigger" in cmd and cmd[cmd.index("--trigger") + 1] == "available-now":
        raise LifecycleError("the benchmark's job runs with an available-now trigger, not a live one")
    if "--interval-seconds" in cmd:
        return float(cmd[cmd.index("--interval-seconds") + 1])
    return float(build_parser().get_default("interval_seconds"))


def freshness_figures(latencies: list[float], produced: int, superseded: int, unseen: int, interval: float,
                      poll: float) -> dict[str, Any]:
    """The benchmark's figures from the probes' latencies in seconds (pure: tested)."""
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    return {"produced": produced, "readable": len(latencies), "superseded": superseded, "unseen": unseen,
            "p50_seconds": None if p50 is None else round(p50, 3),
            "p99_seconds": None if p99 is None else round(p99, 3),
            "max_seconds": round(max(latencies), 3) if latencies else None,
            "trigger_interval_seconds": interval, "poll_seconds": poll,
            "p50_to_interval": ratio(p50, interval, 2), "p99_to_interval": ratio(p99, interval, 2)}


def freshness_lines(f: dict) -> list[str]:
    """The printed result (pure: tested)."""
    lines = [f"freshness, produce -> readable through the alias: p50 {fmt_seconds(f['p50_seconds'])}, "
             f"p99 {fmt_seconds(f['p99_seconds'])}, max {fmt_seconds(f['max_seconds'])} over {f['readable']:,} "
             f"records (of {f['produced']:,} produced; {f['superseded']:,} superseded before readable, "
             f"{f['unseen']:,} never seen)"]
    if f["p50_to_interval"] is not None:
        lines.append(f"reference: the job's trigger interval {fmt_seconds(f['trigger_interval_seconds'])}; "
                     f"p50 = {f['p50_to_interval']:.2f} x interval, p99 = {f['p99_to_interval']:.2f} x interval "
                     f"(latencies include up to one poll, {fmt_seconds(f['poll_seconds'])}, of the reader)")
    ex, jobs = f.get("executor"), f.get("spark_jobs_per_batch")
    if ex and jobs:
        lines.append(f"CPU over the {f['live_seconds']:.1f} s of live updates: the job's executor CPU {ex['cpu_seconds']:.1f} s "
                     f"(Spark's event log), its processes {f['job_process_cpu_seconds']:.1f} s; {jobs['batches']} "
                     f"micro-batches, {jobs['median'] or 0:g} Spark jobs each (median; at most {jobs['max']})")
    return lines


class Probes:
    """The probes in flight: sent, superseded and seen (thread-safe; pure apart from the clock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending: dict[str, tuple[str, float]] = {}   # member_id -> (value, sent at)
        self.latencies: list[float] = []
        self.sent_at: list[float] = []       # when each of `latencies` was sent (monotonic), same order
        self.produced = 0
        self.superseded = 0

    def sent(self, member_id: str, value: str, at: float) -> None:
        with self._lock:
            if member_id in self.pending:
                self.superseded += 1
            self.pending[member_id] = (value, at)
            self.produced += 1

    def ids(self) -> list[str]:
        with self._lock:
            return list(self.pending)

    def sent_between(self, start: float, end: float) -> list[float]:
        """Latencies of the seen probes sent in [start, end) (monotonic seconds)."""
        with self._lock:
            return [lat for lat, at in zip(self.latencies, self.sent_at) if start <= at < end]

    def seen(self, rows: dict[str, str | None], at: float) -> int:
        """`rows` member_id -> value read now; the probes whose value it is are done. Returns how many."""
        done = 0
        with self._lock:
            for mid, value in rows.items():
                want = self.pending.get(mid)
                if want is not None and value == want[0]:
                    self.latencies.append(at - want[1])
                    self.sent_at.append(want[1])
                    del self.pending[mid]
                    done += 1
        return done


def produce_probes(bootstrap: str, topic: str, rate: float, seconds: float, keys: int, run: str, probes: Probes,
             stop: threading.Event, errors: list[str]) -> None:
    """The live producer: `rate` profile updates per second for `seconds`, each sent at once."""
    import json

    from confluent_kafka import Producer

    from orchestrator.dev.datagen import member_key, partition_for, topic_partitions

    try:
        n_parts = topic_partitions(bootstrap, topic)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        start, i = time.monotonic(), 0
        while not stop.is_set() and time.monotonic() - start < seconds:
            key = member_key(i % keys)  # a new member each time until every one had a probe
            value = f"probe-{run}-{i}"
            doc = {"name": "Fresh Probe", "title": "Software Engineer", "company": "Acme", PROBE_COLUMN: value,
                   "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            probes.sent(key.decode(), value, time.monotonic())
            producer.produce(topic, key=key, value=json.dumps(doc).encode(), partition=partition_for(key, n_parts))
            producer.poll(0)
            i += 1
            ahead = i / rate - (time.monotonic() - start)
            if ahead > 0:
                stop.wait(ahead)
        producer.flush(30)
    except Exception as e:  # reported by the benchmark, never swallowed
        errors.append(f"{type(e).__name__}: {e}")


def poll_alias(k, alias: str, probes: Probes, state: dict) -> None:
    """One poll of the alias: reload the table if the pointer or its version moved; mark seen probes."""
    from orchestrator.serving import resolve_alias

    poll_table(resolve_alias(alias, k.settings)["table"], probes, state)


def poll_table(table: str, probes: Probes, state: dict) -> None:
    """One poll of the Delta table `table`: reload it if it or its version moved; mark seen probes."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    from orchestrator.core.tables import read_table

    if state.get("uri") != table:
        state.update(uri=table, dt=DeltaTable(table), version=None)
    dt = state["dt"]
    dt.update_incremental()
    if dt.version() == state.get("version"):
        return
    ids = probes.ids()
    if not ids:
        state["version"] = dt.version()
        return
    quoted = ", ".join("'" + i.replace("'", "''") + "'" for i in ids)
    t = read_table(dt, ["member_id", PROBE_COLUMN], predicate=f"member_id IN ({quoted})")
    now = time.monotonic()
    state["version"] = dt.version()
    t = t.filter(pc.is_valid(t.column(PROBE_COLUMN)))
    probes.seen(dict(zip(t.column("member_id").to_pylist(), t.column(PROBE_COLUMN).to_pylist())), now)


def _spark_work(events, since: float) -> dict[str, Any]:
    """The executor CPU and the Spark jobs per micro-batch in the event logs under `events`, after `since`."""
    from jobs.lib.runtime.sparkwork import event_log_jobs, event_log_time

    jobs = sorted(event_log_jobs(events, since=since).values())
    return {"executor": event_log_time(events, since=since).as_dict(),
            "spark_jobs_per_batch": {"batches": len(jobs), "median": percentile(jobs, 50),
                                     "max": max(jobs) if jobs else None}}


def follow_probes(poll_once, producer: threading.Thread, probes: Probes, poll: float, drain: float, console) -> None:
    """Poll (`poll_once`) while `producer` runs and until every probe is seen or `drain` seconds after it
    ended; a progress line every 2 s."""
    t0 = last_line = time.monotonic()
    drain_until = None
    while True:
        poll_once()
        now = time.monotonic()
        if now - last_line >= 2.0:
            last_line = now
            p50 = percentile(probes.latencies, 50)
            console.print(f"  {now - t0:5.1f} s: {probes.produced:,} produced, {len(probes.latencies):,} "
                          f"readable, {len(probes.pending):,} in flight; p50 so far {fmt_seconds(p50)}",
                          highlight=False)
        if not producer.is_alive():
            drain_until = drain_until or now + drain
            if not probes.pending or now > drain_until:
                break
        time.sleep(poll)


def reference_lines(f: dict) -> list[str]:
    """The plain pipeline's figures beside kappa's (pure: tested); none when it was left out."""
    ref = f.get("plain")
    if not ref:
        return []
    line = (f"reference, a plain Spark pipeline on the same topic (from_json, latest row per key, Delta's MERGE "
            f"from foreachBatch, the same trigger): p50 {fmt_seconds(ref['p50_seconds'])}, p99 "
            f"{fmt_seconds(ref['p99_seconds'])}, max {fmt_seconds(ref['max_seconds'])} over {ref['readable']:,} "
            f"records (of {ref['produced']:,}; {ref['unseen']:,} never seen)")
    ex, jobs = ref.get("executor"), ref.get("spark_jobs_per_batch")
    if ex and jobs:
        line += (f"; executor CPU {ex['cpu_seconds']:.1f} s, its processes {ref['process_cpu_seconds']:.1f} s over "
                 f"{ref['live_seconds']:.1f} s; {jobs['median'] or 0:g} Spark jobs per micro-batch (median)")
    lines = [line]
    p50, p99 = ratio(f.get("p50_seconds"), ref["p50_seconds"], 2), ratio(f.get("p99_seconds"), ref["p99_seconds"], 2)
    if p50 is not None and p99 is not None:
        lines.append(f"kappa / plain: p50 {p50:.2f}x, p99 {p99:.2f}x")
    return lines


def run_freshness_bench(seconds: float = 30.0, rate: float = 20.0, *, records: int = 100_000, keys: int = 20_000,
                        partitions: int = 4, rules: str = "v2", poll: float = 0.05, drain: float = 30.0,
                        deadline: float = 600.0, console=None, overrides: dict[str, Any] | None = None,
                        json_out=None, reference: bool = True) -> dict[str, Any]:
    """Run the freshness benchmark (module docstring); print and return its figures."""
    import os

    from rich.console import Console

    from orchestrator.core.envvars import KAPPA_SPARK_EVENT_LOG_DIR
    from orchestrator.dev.benchutil import process_cpu_seconds
    from orchestrator.dev.demo import ACTOR, PIPELINE, Demo, DemoOptions
    from orchestrator.dev.plainlive import PlainLive
    from orchestrator.jobctl import read_launch
    from orchestrator.lifecycle.await_ready import wait_ready
    from orchestrator.lifecycle.deploy import deploy
    from orchestrator.lifecycle.promote import promote
    from orchestrator.observe.progress import LagProgress

    validate_freshness(seconds, rate, poll, drain, records, keys)
    console = console or Console(highlight=False)
    bench = Demo(DemoOptions(records=records, keys=keys, partitions=partitions, malformed_share=0.0, clean=True,
                             batch=None), console, overrides)
    figures: dict[str, Any] = {"params": {"seconds": seconds, "rate": rate, "records": records, "keys": keys,
                                          "partitions": partitions, "rules": rules, "poll_seconds": poll,
                                          "drain_seconds": drain, "reference": reference},
               "pids_started": []}
    stop, errors, probes = threading.Event(), [], Probes()
    producer = plain = None
    ok = False
    events_env = os.environ.get(KAPPA_SPARK_EVENT_LOG_DIR)
    live_from = cpu0 = None
    try:
        bench.home = bench._make_home()
        events = bench.home / "spark-events"
        os.environ[KAPPA_SPARK_EVENT_LOG_DIR] = str(events)     # the version's job inherits it
        bench.section("Embedded broker and a compacted topic")
        bench.start_broker()
        figures["pids_started"].append(bench.started.broker_pid)
        bench.fill_topic()
        spec = bench.k.pipeline(PIPELINE)
        bench.section(f"deploy, wait until ready, promote (rules {rules})")
        info = deploy(bench.k, spec, rules, actor=ACTOR, reason="freshness benchmark", threshold=0)
        if info.pid:
            bench.started.job_pids[info.version] = info.pid
            figures["pids_started"].append(info.pid)
        bench.say(info.message)
        with LagProgress(console, line_every=5.0) as bars:
            v = bench.k.version(spec, info.version)
            wait_ready(v, deadline_seconds=deadline, poll_seconds=0.5,
                       on_sample=bars.update, actor=ACTOR)
        bench.say(promote(v, actor=ACTOR, reason="freshness benchmark").message)
        interval = trigger_interval((read_launch(v) or {}).get("command"))

        bench.section(f"live producer: {rate:g} updates/s for {seconds:g} s; reading through alias {spec.alias}")
        run = f"{time.time_ns() % 10**9}"
        def producer_of(run_id: str, sent: Probes) -> threading.Thread:
            return threading.Thread(target=produce_probes, name="kappa-bench-fresh-producer", daemon=True,
                                    args=(bench.k.bootstrap_servers, spec.topics[0], rate, seconds, keys, run_id,
                                          sent, stop, errors))
        producer = producer_of(run, probes)
        live_from, cpu0 = time.time(), process_cpu_seconds(info.pid)
        producer.start()
        state: dict[str, Any] = {}
        follow_probes(lambda: poll_alias(bench.k, spec.alias, probes, state), producer, probes, poll, drain, console)
        if errors:
            raise LifecycleError(f"the benchmark's live producer failed: {errors[0]}")
        figures.update(freshness_figures(probes.latencies, probes.produced, probes.superseded,
                                         len(probes.pending), interval, poll))
        figures["version"] = info.version
        figures["live_seconds"] = round(time.time() - live_from, 2)
        figures["job_process_cpu_seconds"] = round(process_cpu_seconds(info.pid) - cpu0, 2)
        if reference:
            from orchestrator.jobctl import stop_version

            bench.section("reference: a plain Spark pipeline on the same topic (kappa's job stopped first)")
            stop_version(v, actor=ACTOR, reason="freshness benchmark: the plain reference runs alone", force=True)
            plain = PlainLive(bench.home / "plain", bench.k.bootstrap_servers, spec.topics[0], interval).start()
            figures["pids_started"].append(plain.pid)
            bench.say(f"plain pipeline (pid {plain.pid}): its first batch appends the log so far...")
            plain.wait_table(deadline)
            stop.clear()
            ref_probes, ref_state = Probes(), {}
            producer = producer_of(f"{run}-plain", ref_probes)
            ref_from, ref_cpu0 = time.time(), process_cpu_seconds(plain.pid)
            producer.start()
            follow_probes(lambda: poll_table(str(plain.output), ref_probes, ref_state), producer, ref_probes, poll,
                          drain, console)
            ref_cpu = process_cpu_seconds(plain.pid) - ref_cpu0
            if errors:
                raise LifecycleError(f"the benchmark's live producer failed: {errors[0]}")
            figures["plain"] = {**freshness_figures(ref_probes.latencies, ref_probes.produced, ref_probes.superseded,
                                                    len(ref_probes.pending), interval, poll),
                                "live_seconds": round(time.time() - ref_from, 2),
                                "process_cpu_seconds": round(ref_cpu, 2)}
        ok = True
    finally:
        stop.set()
        if producer is not None:
            producer.join(40)
        if plain is not None:
            plain.stop()
            console.print(f"stopped the plain pipeline (pid {plain.pid})", highlight=False)
        stopped = bench.cleanup()
        for what, pid in stopped:
            console.print(f"stopped {what} (pid {pid})", highlight=False)
        if ok:
            figures.update(_spark_work(events, live_from))
            if "plain" in figures:
                figures["plain"].update(_spark_work(plain.events, ref_from))
        if events_env is None:
            os.environ.pop(KAPPA_SPARK_EVENT_LOG_DIR, None)
        else:
            os.environ[KAPPA_SPARK_EVENT_LOG_DIR] = events_env
        if bench.home is not None and bench.temp_home:
            shutil.rmtree(bench.home, ignore_errors=True)
    if ok:
        for line in freshness_lines(figures) + reference_lines(figures):
            console.print(f"[bold]{line}[/]" if line.startswith("freshness") else line, highlight=False)
    write_figures(json_out, figures)
    return figures
