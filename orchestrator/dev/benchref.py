"""The benchmarks' reference: the fastest raw read of a log on this machine.

`raw_consume` is one plain confluent-kafka consumer reading every partition from offset zero.
`parallel_raw_consume` is the reference `kappa bench reprocess` compares with: one consumer per
core, each in its own process (multiprocessing with spawn, so that no Spark or broker state is
inherited), the partitions divided among them (`assign_partitions`). Every process builds its
consumer and assigns its partitions first, then all start reading at one barrier, so the figure
is the read alone: total records over the time from the barrier to the last process's end.

Each reader does what the job's reader must do at least: a `consume(10000)` loop over every
message, with Python's garbage collector off, counting key and value bytes.

`consumer_performance` is Kafka's own reference: `org.apache.kafka.tools.ConsumerPerformance` (the
Java consumer, from the fetched JARs) reading the same topic; its figure is its fetch rate, which
leaves out the JVM's start and the consumer group's join.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

from orchestrator.core.exceptions import BrokerError, ConfigError

__all__ = ["FETCH_TUNING", "assign_partitions", "consumer_performance", "raw_consume", "parallel_raw_consume",
           "read_partitions"]

#: The raw consumer fetches like the Kafka source's consumers (jobs.lib.runtime.stream), so the two
#: compare fairly; librdkafka's default fetch.wait.max.ms (500) slows a reader that waits for data.
FETCH_TUNING = {"fetch.wait.max.ms": 100, "queued.min.messages": 200_000,
                "max.partition.fetch.bytes": 8 * 1024 * 1024, "fetch.max.bytes": 64 * 1024 * 1024}
STALL_SECONDS = 600.0


def assign_partitions(partitions: int, processes: int) -> list[list[int]]:
    """Partitions 0..partitions-1 dealt round-robin to at most `processes` readers (none empty).

    Round-robin keeps the readers' shares within one partition of each other; with fewer
    partitions than processes the extra processes are not started.
    """
    if partitions < 1:
        raise ConfigError(f"the topic has {partitions} partitions: the reference needs at least one")
    if processes < 1:
        raise ConfigError(f"--reference-processes must be at least 1, got {processes}")
    groups: list[list[int]] = [[] for _ in range(min(partitions, processes))]
    for p in range(partitions):
        groups[p % len(groups)].append(p)
    return groups


def _consumer(bootstrap: str, config: dict | None):
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": f"kappa-bench-raw-{time.time_ns()}",
                     "enable.auto.commit": False, **FETCH_TUNING, **(config or {})})


def _ends(consumer, topic: str, partitions: list[int]) -> dict[int, int]:
    from confluent_kafka import TopicPartition

    return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}


def read_partitions(consumer, topic: str, ends: dict[int, int], bootstrap: str = "?") -> dict[str, Any]:
    """Read `ends`' partitions of `topic` from offset zero to their end offsets, GC off.

    The consumer must be assigned already. Returns records, bytes and the monotonic start and end
    of the read (CLOCK_MONOTONIC is system-wide on Linux, so processes' times compare).
    """
    left = {p for p, e in ends.items() if e > 0}
    records = size = 0
    gc_was = gc.isenabled()
    gc.disable()
    start = last_progress = time.monotonic()
    try:
        while left:
            msgs = consumer.consume(10000, 0.1)
            for m in msgs:
                if m.error():
                    continue
                records += 1
                size += len(m.value() or b"") + len(m.key() or b"")
                if m.offset() + 1 >= ends[m.partition()]:
                    left.discard(m.partition())
            now = time.monotonic()
            if msgs:
                last_progress = now
            elif now - last_progress > STALL_SECONDS:
                raise BrokerError(f"the raw consumer made no progress for {STALL_SECONDS:.0f} s on {topic} with "
                                  f"partitions {sorted(left)} unfinished; is the broker at {bootstrap} healthy?")
        end = time.monotonic()
    finally:
        if gc_was:
            gc.enable()
    return {"records": records, "bytes": size, "start": start, "end": end}


def raw_consume(bootstrap: str, topic: str, config: dict | None = None) -> dict:
    """One consumer, every partition from offset zero to the high watermark: records, bytes, seconds."""
    from confluent_kafka import TopicPartition

    from orchestrator.dev.datagen import topic_partitions

    n_parts = topic_partitions(bootstrap, topic, config)
    consumer = _consumer(bootstrap, config)
    try:
        ends = _ends(consumer, topic, list(range(n_parts)))
        consumer.assign([TopicPartition(topic, p, 0) for p in range(n_parts)])
        r = read_partitions(consumer, topic, ends, bootstrap)
        return {"records": r["records"], "bytes": r["bytes"], "seconds": r["end"] - r["start"]}
    finally:
        consumer.close()


def _reader_main(bootstrap: str, topic: str, partitions: list[int], config: dict | None, barrier, results) -> None:
    """One reference process (spawned): build and assign its consumer, wait at the barrier, read."""
    from confluent_kafka import TopicPartition

    consumer = _consumer(bootstrap, config)
    try:
        ends = _ends(consumer, topic, partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        barrier.wait(120)
        r = read_partitions(consumer, topic, ends, bootstrap)
        results.put({"pid": os.getpid(), "partitions": partitions, **r})
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        results.put({"pid": os.getpid(), "partitions": partitions, "error": f"{type(e).__name__}: {e}"})
        try:
            barrier.abort()
        except Exception:
            pass
    finally:
        consumer.close()


def parallel_raw_consume(bootstrap: str, topic: str, processes: int | None = None,
                         config: dict | None = None, timeout: float = 900.0) -> dict[str, Any]:
    """The reference: one consumer per core (or `processes`) in parallel processes (module docstring).

    Returns records, bytes, seconds (barrier to the last reader's end), the processes' partitions
    and each one's own figures. Every process it starts is joined, or killed by its PID.
    """
    import multiprocessing as mp
    import queue as queue_mod

    from orchestrator.dev.datagen import topic_partitions

    processes = processes or os.cpu_count() or 1
    groups = assign_partitions(topic_partitions(bootstrap, topic, config), processes)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(groups))
    results = ctx.Queue()
    procs = [ctx.Process(target=_reader_main, args=(bootstrap, topic, g, config, barrier, results),
                         name=f"kappa-bench-reference-{i}", daemon=True) for i, g in enumerate(groups)]
    got: list[dict] = []
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        while len(got) < len(procs):
            try:
                got.append(results.get(timeout=1.0))
            except queue_mod.Empty:
                if time.monotonic() > deadline:
                    raise BrokerError(f"the reference readers of {topic} did not finish within {timeout:.0f} s") from None
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and len(got) < len(procs):
                    raise BrokerError(f"a reference reader of {topic} died (pid {dead[0].pid}, exit "
                                      f"{dead[0].exitcode}) before reporting") from None
        errors = [r["error"] for r in got if "error" in r]
        if errors:
            raise BrokerError(f"a reference reader of {topic} failed: {errors[0]}")
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        results.close()
    start = min(r["start"] for r in got)
    end = max(r["end"] for r in got)
    per = sorted(({"pid": r["pid"], "partitions": r["partitions"], "records": r["records"],
                   "seconds": round(r["end"] - r["start"], 3)} for r in got), key=lambda r: r["partitions"])
    return {"records": sum(r["records"] for r in got), "bytes": sum(r["bytes"] for r in got),
            "seconds": end - start, "processes": len(procs), "per_process": per,
            "pids": [p.pid for p in procs]}


def consumer_performance(bootstrap: str, topic: str, records: int, config: dict | None = None,
                         timeout: float = 600.0) -> dict[str, Any]:
    """Kafka's ConsumerPerformance over `records` records of `topic` (all it holds, from offset zero).

    Returns records, bytes (as the tool counts them: values only) and seconds of its fetch phase,
    plus its whole run (JVM start and group join included). Settings with secrets go through a
    0600 file (`--command-config`), never the command line.
    """
    import tempfile

    from orchestrator.dev.broker import kafka_tool

    props = {k: v for k, v in (config or {}).items() if isinstance(v, (str, int, float, bool))}
    fd, conf = tempfile.mkstemp(prefix="kafka-perf-", suffix=".properties")
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in props.items()))
    start = time.perf_counter()
    try:
        out = kafka_tool("org.apache.kafka.tools.ConsumerPerformance",
                         ["--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(records),
                          "--timeout", str(int(timeout * 1000)), "--command-config", conf,
                          "--group", f"kappa-bench-perf-{time.time_ns()}"], timeout=timeout + 60, jvm_jit=True)
    finally:
        os.unlink(conf)
    whole = time.perf_counter() - start
    lines = [ln for ln in out.splitlines() if ln.strip()]
    header = next((i for i, ln in enumerate(lines) if ln.startswith("start.time")), None)
    if header is None or header + 1 >= len(lines):
        raise BrokerError(f"Kafka's ConsumerPerformance printed no figures for {topic}: {' | '.join(lines[-3:])}")
    names = [c.strip() for c in lines[header].split(",")]
    row = dict(zip(names, (c.strip() for c in lines[header + 1].split(","))))
    n = int(float(row["data.consumed.in.nMsg"]))
    mb = float(row["data.consumed.in.MB"])
    fetch_ms = float(row["fetch.time.ms"])
    return {"records": n, "bytes": int(mb * 1024 * 1024), "seconds": fetch_ms / 1000.0,
            "whole_seconds": whole, "rebalance_ms": float(row.get("rebalance.time.ms", 0) or 0)}
