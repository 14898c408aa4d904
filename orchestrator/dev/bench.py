"""`kappa bench reprocess|deploy`: how fast a full standardize reprocess reads a log, and how long
a deploy takes to become a promoted version.

`run_deploy_bench` times deploy -> ready -> promote on the demo's embedded stack (see its
docstring). `run_reprocess_bench` measures a reprocess against a raw consumer; one run, on an
embedded broker started for it (or on `bootstrap` if given):

1. produce `records` member-profile changes over `keys` members into a `partitions`-partition
   compacted topic. The producer batches (lz4) for speed, then sends the last record of each
   partition on its own, because tansu reports a wrong high watermark for a batch of several
   records (the base offset of the last batch + 1);
2. the reference: one confluent-kafka consumer reads everything from offset zero (Python's
   garbage collector off while it runs, as the Kafka source does);
3. a full standardize reprocess from offset zero into an empty Delta table, in this process:
   Spark start-up is timed on its own, then the available-now query from start to end (read
   in the driver, as the job does by default, or through Spark's data path with read="spark");
4. a self-check of what the benchmark can verify without the rules: every member's last
   upsert as the generator made it (told by the record's kind, not by parsing the log) against
   the output's raw columns (member_id, name, title_raw, company_raw, location), and the number
   of malformed records against the rejects. What the rules make of titles and companies is not
   checked here (that would mean running the rules engine against itself): the test suite
   compares the kept output (`workdir`) with its own golden mapping.

Throughput counts key + value bytes. Peak memory is the largest sum of resident memory of this
process and all its children (the Spark JVM and its Python workers), sampled every 0.2 s.
"""

from __future__ import annotations

import gc
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.exceptions import BrokerError, LifecycleError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["raw_consume", "check_against_generator", "run_reprocess_bench", "run_deploy_bench", "main"]
RAW_COLUMNS = ("member_id", "name", "title_raw", "company_raw", "location")
NOT_CHECKED = "title and company (the rules' output): the test suite checks them against its golden file"

SPARK_NOTE = "excluding Spark start-up"
#: The raw consumer fetches like the Kafka source's consumers (jobs.lib.kafka), so the two
#: compare fairly; librdkafka's default fetch.wait.max.ms (500) more than halves the rate on tansu.
FETCH_TUNING = {"fetch.wait.max.ms": 100, "queued.min.messages": 200_000,
                "max.partition.fetch.bytes": 8 * 1024 * 1024, "fetch.max.bytes": 64 * 1024 * 1024}


class _PeakMemory:
    """Samples the RSS of this process plus its children until stopped."""

    def __init__(self, interval: float = 0.2):
        import psutil

        self.proc = psutil.Process()
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kappa-bench-memory", daemon=True)

    def sample(self) -> int:
        import psutil

        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        self.peak = max(self.peak, total)
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "_PeakMemory":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()


def raw_consume(bootstrap: str, topic: str, config: dict | None = None) -> dict:
    """One consumer, every partition from offset zero to the high watermark: records, bytes, seconds."""
    from confluent_kafka import Consumer, TopicPartition

    from orchestrator.dev.datagen import topic_partitions

    n_parts = topic_partitions(bootstrap, topic, config)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kappa-bench-raw-{time.time_ns()}",
                         "enable.auto.commit": False, **FETCH_TUNING, **(config or {})})
    try:
        ends = {}
        for p in range(n_parts):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in range(n_parts)])
        left = {p for p, e in ends.items() if e > 0}
        records = size = 0
        gc_was = gc.isenabled()
        gc.disable()
        start = time.perf_counter()
        try:
            while left:
                msgs = consumer.consume(10000, 1.0)
                for m in msgs:
                    if m.error():
                        continue
                    records += 1
                    size += len(m.value() or b"") + len(m.key() or b"")
                    if m.offset() + 1 >= ends[m.partition()]:
                        left.discard(m.partition())
                if not msgs and time.perf_counter() - start > 600:
                    raise BrokerError(f"the raw consumer made no progress for 600 s on {topic} with partitions "
                                      f"{sorted(left)} unfinished; is the broker at {bootstrap} healthy?")
            seconds = time.perf_counter() - start
        finally:
            if gc_was:
                gc.enable()
        return {"records": records, "bytes": size, "seconds": seconds}
    finally:
        consumer.close()


def check_against_generator(output, rejects: int, changes) -> dict[str, Any]:
    """The self-check of step 4 (module docstring): `output` the job's table, `rejects` its count,
    `changes` the generator's records (ChangeRecord, in produce order)."""
    import pyarrow as pa

    last: dict[bytes, bytes] = {}
    malformed = 0
    for rec in changes:
        if rec.kind == "upsert":
            last[rec.key] = rec.value
        elif rec.kind == "tombstone":
            last.pop(rec.key, None)
        else:
            malformed += 1
    ids = sorted(last)
    docs = [json.loads(last[k]) for k in ids]
    fields = {"name": "name", "title_raw": "title", "company_raw": "company", "location": "location"}
    expected = pa.table({"member_id": pa.array([k.decode() for k in ids], pa.string()),
                         **{c: pa.array([d.get(f) for d in docs], pa.string()) for c, f in fields.items()}})
    got = output.select(list(RAW_COLUMNS)).sort_by("member_id")
    got = pa.table({c: got[c].cast(pa.string()) for c in RAW_COLUMNS})
    return {"rows": output.num_rows, "expected_rows": expected.num_rows, "raw_columns_match": got.equals(expected),
            "rejects": rejects, "expected_rejects": malformed, "rejects_match": rejects == malformed,
            "not_checked": NOT_CHECKED}


def _rate(records: int, size: int, seconds: float) -> dict:
    seconds = max(seconds, 1e-9)
    return {"records": records, "bytes": size, "seconds": round(seconds, 3),
            "records_per_s": round(records / seconds), "mb_per_s": round(size / seconds / 1e6, 2)}


def run_reprocess_bench(records: int = 2_000_000, keys: int = 500_000, partitions: int = 4,
                        value_size: int = 200, json_out: str | Path | None = None, *,
                        max_records_per_batch: int = 100_000, rules_version: str = "v2",
                        malformed_share: float = 0.0, delete_share: float = 0.02, seed: int = 42,
                        bootstrap: str | None = None, kafka_config: dict | None = None,
                        master: str | None = None, workdir: str | Path | None = None,
                        read: str = "driver", verify: bool = True, console=None) -> dict[str, Any]:
    """Run the reprocess benchmark (module docstring); print a table, return (and optionally write) figures."""
    from rich.console import Console

    from jobs.lib.delta_sink import read_table
    from jobs.lib.rules import load_rules, rules_path
    from orchestrator.dev.broker import EmbeddedBroker
    from orchestrator.dev.datagen import ensure_topic, generate_changelog, produce

    console = console or Console()
    rules = load_rules(rules_path("titles", rules_version))
    own_dir = workdir is None
    work = Path(tempfile.mkdtemp(prefix="kappa-bench-")) if own_dir else Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    broker = None
    figures: dict[str, Any] = {
        "params": {"records": records, "keys": keys, "partitions": partitions, "value_size": value_size,
                   "max_records_per_batch": max_records_per_batch, "rules": rules_version,
                   "malformed_share": malformed_share, "delete_share": delete_share, "seed": seed,
                   "read": read},
    }
    changes = dict(seed=seed, value_size=value_size, malformed_share=malformed_share, delete_share=delete_share)
    try:
        if bootstrap is None:
            broker = EmbeddedBroker(log_path=work / "tansu.log").start()
            bootstrap = broker.bootstrap_servers
        topic = f"bench_profiles_{time.time_ns() % 10**9}"
        figures["topic"] = topic
        ensure_topic(bootstrap, topic, partitions, config=kafka_config)
        console.print(f"producing {records:,} records (~{value_size} B values, {keys:,} keys, {partitions} partitions) "
                      f"to {topic} on {bootstrap}: batched, then the last record of each partition alone "
                      f"(tansu's high watermark is only right after a one-record batch)")
        stats = produce(bootstrap, topic, generate_changelog(records, keys, **changes),
                        batching=True, partitions=partitions, config=kafka_config)
        figures["produce"] = {**_rate(stats.records, stats.bytes, stats.seconds), "singles": stats.singles}

        console.print("reference: one confluent-kafka consumer reading from offset zero...")
        raw = raw_consume(bootstrap, topic, kafka_config)
        figures["raw_consumer"] = _rate(raw["records"], raw["bytes"], raw["seconds"])
        if raw["records"] != records:
            raise BrokerError(f"the raw consumer read {raw['records']:,} records of {topic}, {records:,} were "
                              f"produced: the broker's high watermarks are off (a batched producer on tansu?)")

        console.print("standardize reprocess from offset zero into an empty Delta table (available-now)...")
        with _PeakMemory() as mem:
            job = _reprocess(bootstrap, topic, rules, work, max_records_per_batch, kafka_config, master,
                             console, records, read)
        figures["spark_startup_seconds"] = round(job["startup"], 2)
        figures["reprocess"] = _rate(records, raw["bytes"], job["seconds"])
        figures["reprocess"]["batches"] = job["batches"]
        figures["reprocess"]["read"] = read
        figures["reprocess"]["rejects"] = job["rejects"]
        figures["reprocess_with_startup"] = _rate(records, raw["bytes"], job["seconds"] + job["startup"])
        figures["reprocess_first_to_last_batch"] = _rate(
            records, raw["bytes"], job["seconds"] - job["split"].get("until_first_batch", 0)
            - job["split"].get("after_last_batch", 0))
        figures["time_split_seconds"] = job["split"]
        figures["peak_memory_mb"] = round(mem.peak / 1e6)
        figures["ratio_to_raw"] = round(figures["reprocess"]["records_per_s"]
                                        / max(1, figures["raw_consumer"]["records_per_s"]), 3)
        if verify:
            console.print("checking the output's raw columns and the rejects against the generated records...")
            figures["check"] = check_against_generator(read_table(job["output"]), job["rejects"],
                                                       generate_changelog(records, keys, **changes))
    finally:
        if broker is not None:
            broker.stop()
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)
    _print(console, figures)
    if json_out is not None:
        path = Path(json_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return figures


def _reprocess(bootstrap: str, topic: str, rules, work: Path, max_records: int, kafka_config: dict | None,
               master: str | None, console, total: int, read: str) -> dict:
    from argparse import Namespace

    from jobs.lib.session import build_session
    from jobs.standardize import make_writer

    t0 = time.perf_counter()
    spark = build_session("kappa-bench-reprocess", master=master, local_dir=str(work / "spark-local"),
                          extra={"spark.ui.showConsoleProgress": "false"})
    startup = time.perf_counter() - t0
    try:
        args = Namespace(pipeline="bench", version=1, output=str(work / "out"), rejects=str(work / "out__rejects"),
                         checkpoint=str(work / "checkpoint"))
        done = [0]

        def progress(batch_id, rows_in, rows_out, rejects, rejects_total=None):
            done[0] += rows_in
            t = writer.timings[-1]
            console.print(f"  micro-batch {batch_id}: {done[0]:,}/{total:,} records (fetch {t['fetch']:.2f} s, "
                          f"transform {t['transform']:.2f} s, Delta {t['write']:.2f} s)")

        options = {"bootstrap.servers": bootstrap, "topics": topic, "max.records.per.batch": str(max_records),
                   "min.partitions": str(max(1, spark.sparkContext.defaultParallelism)),
                   **{f"kafka.{k}": str(v) for k, v in (kafka_config or {}).items()}}
        writer = make_writer(args, rules, on_batch=progress, source_options=options if read == "driver" else None)
        reader = spark.readStream.format("kappa_kafka")
        for k, v in options.items():
            reader = reader.option(k, v)
        t1 = time.perf_counter()
        query = (reader.load().writeStream.foreachBatch(writer).option("checkpointLocation", args.checkpoint)
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination()
        finally:
            if query.isActive:
                query.stop()
        seconds = time.perf_counter() - t1
        if query.exception() is not None:
            raise LifecycleError(f"the benchmark's standardize query failed: {query.exception()}")
    finally:
        spark.stop()
    split = {}
    for t in writer.timings:
        for k in ("fetch", "transform", "write", "parse", "dedup", "rules"):
            split[k] = split.get(k, 0.0) + t.get(k, 0.0)
    inside = sum(t["left"] - t["entered"] for t in writer.timings)
    split["idempotency_check"] = inside - sum(split.get(k, 0.0) for k in ("fetch", "transform", "write"))
    if writer.timings:
        split["until_first_batch"] = writer.timings[0]["entered"] - t1
        split["after_last_batch"] = t1 + seconds - writer.timings[-1]["left"]
    split["between_batches"] = seconds - inside - split.get("until_first_batch", 0) - split.get("after_last_batch", 0)
    split = {k: round(v, 2) for k, v in split.items()}
    return {"startup": startup, "seconds": seconds, "batches": len(writer.timings), "split": split,
            "rejects": writer.rejects_total, "output": args.output}


def _print(console, f: dict) -> None:
    from rich.table import Table

    t = Table(title="kappa bench reprocess", show_lines=False)
    t.add_column("")
    t.add_column("records/s", justify="right")
    t.add_column("MB/s", justify="right")
    t.add_column("seconds", justify="right")
    t.add_column("notes")
    p = f.get("produce")
    if p:
        t.add_row("produce (lz4 batches)", f"{p['records_per_s']:,}", f"{p['mb_per_s']:.1f}", f"{p['seconds']:.1f}",
                  f"{p['singles']} last records sent alone (tansu watermark)")
    r = f.get("raw_consumer")
    if r:
        t.add_row("raw consumer (reference)", f"{r['records_per_s']:,}", f"{r['mb_per_s']:.1f}",
                  f"{r['seconds']:.1f}", "one confluent-kafka consumer, GC off")
    s = f.get("reprocess")
    if s:
        t.add_row("standardize reprocess", f"{s['records_per_s']:,}", f"{s['mb_per_s']:.1f}", f"{s['seconds']:.1f}",
                  f"{SPARK_NOTE}; {s['batches']} micro-batches; "
                  + ("read in the driver" if s["read"] == "driver" else "read through Spark"))
        b = f["reprocess_first_to_last_batch"]
        t.add_row("  first to last batch", f"{b['records_per_s']:,}", f"{b['mb_per_s']:.1f}", f"{b['seconds']:.1f}",
                  "without the query's start (source set-up, first offsets)")
        w = f["reprocess_with_startup"]
        t.add_row("  with Spark start-up", f"{w['records_per_s']:,}", f"{w['mb_per_s']:.1f}", f"{w['seconds']:.1f}",
                  f"start-up {f['spark_startup_seconds']:.1f} s")
    console.print(t)
    if s:
        split = f["time_split_seconds"]
        console.print(f"ratio reprocess / raw consumer: {f['ratio_to_raw']:.3f}; peak memory (this process + "
                      f"Spark JVM + Python workers): {f['peak_memory_mb']:,} MB")
        console.print(
            f"where the reprocess time goes (s): query start to first batch {split.get('until_first_batch', 0):.1f}; "
            f"reading the batches {split.get('fetch', 0):.1f}; transform {split.get('transform', 0):.1f} (parse "
            f"{split.get('parse', 0):.1f}, dedup {split.get('dedup', 0):.1f}, rules {split.get('rules', 0):.1f}); "
            f"Delta writes {split.get('write', 0):.1f} (+ idempotency checks {split.get('idempotency_check', 0):.1f}); "
            f"Spark between batches (checkpoint, offsets, planning) {split.get('between_batches', 0):.1f}; "
            f"after the last batch {split.get('after_last_batch', 0):.1f}")
    c = f.get("check")
    if c:
        def verdict(ok: bool) -> str:
            return "[green]yes[/]" if ok else "[red]NO[/]"

        console.print(f"output's raw columns match the generated records: {verdict(c['raw_columns_match'])} "
                      f"({c['rows']:,} rows, expected {c['expected_rows']:,})")
        console.print(f"rejects match the malformed records: {verdict(c['rejects_match'])} ({c['rejects']:,}, "
                      f"expected {c['expected_rejects']:,})")
        console.print(f"not checked here: {c['not_checked']}")


def run_deploy_bench(records: int = 2_000_000, keys: int = 500_000, *, partitions: int = 4, value_size: int = 200,
                     rules: str = "v2", poll: float = 0.5, deadline: float = 3600.0, console: Console | None = None,
                     overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Time from `deploy` to a finished `promote` of a version over a `records`-record log, Spark start-up included.

    On the embedded stack in a temporary home, with a quiet topic (no live producer), so the
    version is ready when its lag is 0 for the pipeline's consecutive samples. Phases: the deploy
    call (checks, version allocation, job spawn), Spark start-up (until the job reports running),
    the backfill (until lag is first 0), the readiness confirmation (the consecutive samples), and
    the promote (checks, report, flip, publish). Everything started is stopped by PID.
    """
    from time import perf_counter

    from rich.console import Console

    from orchestrator.dev.demo import ACTOR, PIPELINE, Demo, DemoOptions
    from orchestrator.lifecycle.await_ready import wait_ready
    from orchestrator.lifecycle.deploy import deploy
    from orchestrator.lifecycle.promote import promote
    from orchestrator.observe.progress import LagProgress

    console = console or Console(highlight=False)
    opts = DemoOptions(records=records, keys=keys, partitions=partitions, value_size=value_size,
                       malformed_share=0.0, clean=True, batch=None)
    bench = Demo(opts, console, overrides)
    figures: dict[str, Any] = {"params": {"records": records, "keys": keys, "partitions": partitions,
                                          "value_size": value_size, "rules": rules, "poll_seconds": poll}}
    ok = False
    try:
        bench.home = bench._make_home()
        bench.section("Embedded broker and a compacted topic")
        bench.start_broker()
        bench.fill_topic()
        spec = bench.k.pipeline(PIPELINE)
        bench.section(f"deploy -> ready -> promote of {records:,} records (rules {rules})")
        marks: dict[str, float] = {}
        t0 = perf_counter()
        info = deploy(bench.k, PIPELINE, rules, actor=ACTOR, reason="deploy-to-promote benchmark", threshold=0)
        marks["deployed"] = perf_counter()
        if info.pid:
            bench.started.job_pids[info.version] = info.pid
        bench.say(info.message)

        with LagProgress(console, line_every=5.0) as bars:
            def on_sample(r) -> None:
                now = perf_counter()
                if "running" not in marks and r.job.get("health") == "running":
                    marks["running"] = now
                if "caught_up" not in marks and r.total_lag is not None and r.total_lag <= r.threshold:
                    marks["caught_up"] = now
                bars.update(r)

            wait_ready(bench.k, PIPELINE, info.version, deadline_seconds=deadline, poll_seconds=poll,
                       on_sample=on_sample, actor=ACTOR)
        marks["ready"] = perf_counter()
        res = promote(bench.k, PIPELINE, info.version, actor=ACTOR, reason="deploy-to-promote benchmark")
        marks["promoted"] = perf_counter()
        bench.say(res.message)
        running = marks.get("running", marks["deployed"])
        caught = marks.get("caught_up", marks["ready"])
        figures.update({
            "deploy_to_promote_seconds": round(marks["promoted"] - t0, 2),
            "phases_seconds": {
                "deploy_call": round(marks["deployed"] - t0, 2),
                "spark_startup": round(running - marks["deployed"], 2),
                "backfill": round(caught - running, 2),
                "readiness_confirmation": round(marks["ready"] - caught, 2),
                "promote": round(marks["promoted"] - marks["ready"], 2),
            },
            "backfill_records_per_s": round(records / max(caught - running, 1e-9)),
            "catchup_samples": spec.catchup_samples,
            "version": info.version,
        })
        ok = True
    finally:
        stopped = bench.cleanup()
        for what, pid in stopped:
            console.print(f"stopped {what} (pid {pid})", highlight=False)
        if bench.home is not None:
            shutil.rmtree(bench.home, ignore_errors=True)
    if ok:
        ph = figures["phases_seconds"]
        console.print(f"[bold]deploy -> promote: {figures['deploy_to_promote_seconds']:.1f} s[/] for {records:,} records "
                      f"(deploy call {ph['deploy_call']:.1f} s, Spark start-up {ph['spark_startup']:.1f} s, backfill "
                      f"{ph['backfill']:.1f} s = {figures['backfill_records_per_s']:,} records/s, readiness "
                      f"confirmation {ph['readiness_confirmation']:.1f} s ({spec.catchup_samples} samples every "
                      f"{poll:g} s), promote {ph['promote']:.1f} s)", highlight=False)
    return figures


def main(argv: list[str] | None = None) -> None:
    """`python -m orchestrator.dev.bench` (the CLI's `kappa bench reprocess` calls run_reprocess_bench)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m orchestrator.dev.bench", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--keys", type=int, default=500_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--value-size", type=int, default=200)
    p.add_argument("--max-records-per-batch", type=int, default=100_000)
    p.add_argument("--rules", default="v2")
    p.add_argument("--malformed-share", type=float, default=0.0)
    p.add_argument("--read", choices=("driver", "spark"), default="driver",
                   help="read micro-batches in the driver (the job's default) or through Spark's data path")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--bootstrap", default=None, help="produce to this broker instead of an embedded one")
    p.add_argument("--workdir", default=None, help="work here and keep it (the output table is in out/)")
    p.add_argument("--json", dest="json_out", default=None)
    a = p.parse_args(argv)
    run_reprocess_bench(a.records, a.keys, a.partitions, a.value_size, a.json_out,
                        max_records_per_batch=a.max_records_per_batch, rules_version=a.rules,
                        malformed_share=a.malformed_share, seed=a.seed, bootstrap=a.bootstrap,
                        workdir=a.workdir, read=a.read)


if __name__ == "__main__":
    main()
