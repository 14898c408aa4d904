"""`kappa bench reprocess|parse|freshness|contention|cluster|upsert|deploy|flip`: the benchmarks behind the README's figures.

Each runs the code in `orchestrator.dev` and prints its figures (with `--out`, also into a JSON
file). `reprocess`, `freshness`, `contention`, `cluster` and `deploy` start their own embedded broker (`reprocess`
unless told otherwise) and stop everything they started by PID.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from orchestrator.cli.app import AsJson, app, cli_of, default_actor, new_typer
from orchestrator.cli.render import print_json, to_json, write_json

__all__ = ["bench_app"]

bench_app = new_typer(help="Benchmarks: reprocess throughput, where the parse spends its CPU, freshness, the cost of a reprocess to the serving version, cluster scaling, deploy-to-promote time, flip latency.")
app.add_typer(bench_app, name="bench")


@bench_app.command("reprocess")
def bench_reprocess(
    ctx: typer.Context,
    records: Annotated[int, typer.Option("--records", min=1, help="records to produce")] = 2_000_000,
    keys: Annotated[int, typer.Option("--keys", min=1, help="distinct keys")] = 500_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="topic partitions")] = 4,
    value_size: Annotated[int, typer.Option("--value-size", min=50, help="bytes per value, about")] = 200,
    max_records_per_batch: Annotated[int, typer.Option("--max-records-per-batch", min=1, help="micro-batch cap (the standardize pipeline's)")] = 500_000,
    rules: Annotated[str, typer.Option("--rules", help="rules version of the titles ruleset")] = "v2",
    malformed_share: Annotated[float, typer.Option("--malformed-share", min=0.0, max=1.0, help="share of malformed records")] = 0.0,
    reference_processes: Annotated[Optional[int], typer.Option("--reference-processes", min=1, help="raw consumer processes of the reference (default: one per core)")] = None,
    extra: Annotated[Optional[str], typer.Option("--extra", help="the job's --extra, a JSON object (as a pipeline's options)")] = None,
    use_configured_broker: Annotated[bool, typer.Option("--use-configured-broker", help="produce to the configured bootstrap servers instead of a fresh embedded broker")] = False,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="check the output's raw columns and rejects against the generated records")] = True,
    workdir: Annotated[Optional[Path], typer.Option("--workdir", help="work here and keep it (output table in out/)")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="also write the figures as JSON here")] = None,
) -> None:
    """Full standardize reprocess from offset zero against the fastest raw read of the same log
    (one consumer process per core): records/s, MB/s, ratio, time breakdown, peak memory."""
    from orchestrator.dev.bench import run_reprocess_bench
    from orchestrator.dev.benchutil import parse_json_object

    cli = cli_of(ctx)
    settings = cli.settings()
    job_extra = parse_json_object(extra, "--extra")
    bootstrap = kafka_config = None
    if use_configured_broker:
        k = cli.kappa()
        bootstrap, kafka_config = k.bootstrap_servers, k.settings.kafka_client_config()
        kafka_config.pop("bootstrap.servers", None)
    run_reprocess_bench(records, keys, partitions, value_size, out, max_records_per_batch=max_records_per_batch,
                        rules_version=rules, malformed_share=malformed_share, bootstrap=bootstrap,
                        kafka_config=kafka_config or None, master=settings.spark_master, verify=verify,
                        extra=job_extra, reference_processes=reference_processes, workdir=workdir,
                        console=cli.out)
    if out is not None:
        cli.out.print(f"wrote {out}")


@bench_app.command("parse")
def bench_parse(
    ctx: typer.Context,
    records: Annotated[int, typer.Option("--records", min=1, help="records in the log")] = 2_000_000,
    keys: Annotated[int, typer.Option("--keys", min=1, help="distinct keys")] = 500_000,
    value_size: Annotated[int, typer.Option("--value-size", min=50, help="bytes per value, about")] = 200,
    malformed_share: Annotated[float, typer.Option("--malformed-share", min=0.0, max=1.0, help="share of malformed records")] = 0.0,
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="times each step runs (the lowest counts; the first warms the JIT)")] = 2,
    step: Annotated[Optional[list[str]], typer.Option("--step", help="run only this step (repeatable); from_json, the reference, always runs")] = None,
    workdir: Annotated[Optional[Path], typer.Option("--workdir", help="work here and keep it (the log in log.parquet)")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="also write the figures as JSON here")] = None,
    as_json: AsJson = False,
) -> None:
    """Where the standardize job's parse spends its CPU, step by step (kappa's JVM reading, the judge's
    verdict and strings, the exact path, the latest row per key, and the designs tried: the variant parse
    it replaced, from_json into variants), against Spark's own from_json in the same run.
    Local Spark, no broker: the log of `bench reprocess` as Parquet, each step into Spark's noop sink."""
    from orchestrator.dev.parsebench import run_parse_bench

    cli = cli_of(ctx)
    figures = run_parse_bench(records, keys, value_size=value_size, malformed_share=malformed_share, rounds=rounds,
                              steps=step, workdir=workdir, console=cli.err if as_json else cli.out)
    write_json(out, figures)
    if as_json:
        print_json(figures)
    elif out is not None:
        cli.out.print(f"wrote {out}")


@bench_app.command("freshness")
def bench_freshness(
    ctx: typer.Context,
    seconds: Annotated[float, typer.Option("--seconds", help="how long the live producer runs")] = 30.0,
    rate: Annotated[float, typer.Option("--rate", help="profile updates per second")] = 20.0,
    records: Annotated[int, typer.Option("--records", min=1, help="records in the log before the deploy")] = 100_000,
    keys: Annotated[int, typer.Option("--keys", min=1, help="distinct members")] = 20_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="topic partitions")] = 4,
    rules: Annotated[str, typer.Option("--rules", help="rules version")] = "v2",
    poll: Annotated[float, typer.Option("--poll", help="seconds between the reader's polls of the alias")] = 0.05,
    drain: Annotated[float, typer.Option("--drain", help="seconds to wait for the last records after the producer stops")] = 30.0,
    reference: Annotated[bool, typer.Option("--reference/--no-reference",
                                            help="then measure a plain Spark pipeline on the same topic")] = True,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="also write the figures as JSON here")] = None,
    as_json: AsJson = False,
) -> None:
    """Time from a record produced to its value readable through the serving alias: p50, p99.

    Deploys and promotes a standardize version (live trigger) on its own embedded stack, runs a live
    producer, polls the alias; the references are the job's trigger interval and, measured next with
    kappa's job stopped, a plain Spark pipeline (from_json, Delta's MERGE) on the same topic, read
    the same way. Stops all it started.
    """
    from orchestrator.dev.freshbench import run_freshness_bench

    cli = cli_of(ctx)
    figures = run_freshness_bench(seconds, rate, records=records, keys=keys, partitions=partitions, rules=rules,
                                  poll=poll, drain=drain, console=cli.err if as_json else cli.out,
                                  overrides=cli.overrides, reference=reference)
    write_json(out, figures)
    if as_json:
        print_json(figures)
    elif out is not None:
        cli.out.print(f"wrote {out}")


@bench_app.command("contention")
def bench_contention(
    ctx: typer.Context,
    records: Annotated[int, typer.Option("--records", min=1, help="records in the log each new version backfills")] = 2_000_000,
    keys: Annotated[int, typer.Option("--keys", min=1, help="distinct members")] = 500_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="topic partitions")] = 4,
    value_size: Annotated[int, typer.Option("--value-size", min=50, help="bytes per value, about")] = 200,
    seconds: Annotated[float, typer.Option("--seconds", help="length of the serving-alone window")] = 30.0,
    rate: Annotated[float, typer.Option("--rate", help="live profile updates per second")] = 20.0,
    rules: Annotated[str, typer.Option("--rules", help="rules version")] = "v2",
    poll: Annotated[float, typer.Option("--poll", help="seconds between the reader's polls of the alias")] = 0.1,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="also write the figures as JSON here")] = None,
    as_json: AsJson = False,
) -> None:
    """What a reprocess costs the serving version: freshness p50/p99 alone, then while a new version
    backfills the log with the adaptive share off and on; each backfill's time against the same
    backfill alone. Runs on its own embedded stack and stops all it started."""
    from orchestrator.dev.contentionbench import run_contention_bench

    cli = cli_of(ctx)
    figures = run_contention_bench(seconds, rate, records=records, keys=keys, partitions=partitions,
                                   value_size=value_size, rules=rules, poll=poll,
                                   console=cli.err if as_json else cli.out, overrides=cli.overrides)
    write_json(out, figures)
    if as_json:
        print_json(figures)
    elif out is not None:
        cli.out.print(f"wrote {out}")


@bench_app.command("cluster")
def bench_cluster(
    ctx: typer.Context,
    sizes: Annotated[str, typer.Option("--sizes", help="log sizes, comma-separated (e.g. 1M,4M or 20000)")] = "1M,4M",
    partitions: Annotated[int, typer.Option("--partitions", min=2, help="topic partitions")] = 4,
    value_size: Annotated[int, typer.Option("--value-size", min=50, help="bytes per value, about")] = 200,
    max_records_per_batch: Annotated[int, typer.Option("--max-records-per-batch", min=1, help="micro-batch cap")] = 500_000,
    rules: Annotated[str, typer.Option("--rules", help="rules version")] = "v2",
    executor_memory: Annotated[str, typer.Option("--executor-memory", help="spark.executor.memory")] = "1g",
    extra: Annotated[Optional[str], typer.Option("--extra", help="the job's --extra, a JSON object")] = None,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="check each run's output against the generated records")] = True,
    workdir: Annotated[Optional[Path], typer.Option("--workdir", help="work here and keep it (logs, cluster logs)")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="also write the figures as JSON here")] = None,
    as_json: AsJson = False,
) -> None:
    """The same reprocess on a Spark standalone cluster on this machine with 1 worker of 1 core, then
    2: throughput ratio (goal >= 1.7) and the driver's peak memory at each log size."""
    from orchestrator.dev.benchutil import parse_counts, parse_json_object
    from orchestrator.dev.clusterbench import run_cluster_bench

    cli = cli_of(ctx)
    figures = run_cluster_bench(parse_counts(sizes, "--sizes"), partitions=partitions, value_size=value_size,
                                max_records_per_batch=max_records_per_batch, rules=rules,
                                executor_memory=executor_memory, extra=parse_json_object(extra, "--extra"),
                                verify=verify, workdir=workdir, console=cli.err if as_json else cli.out)
    write_json(out, figures)
    if as_json:
        print_json(figures)
    elif out is not None:
        cli.out.print(f"wrote {out}")


@bench_app.command("upsert")
def bench_upsert(
    ctx: typer.Context,
    rows: Annotated[int, typer.Option("--rows", min=1, help="rows in the table")] = 2_000_000,
    changed: Annotated[int, typer.Option("--changed", min=1, help="changed keys in each micro-batch")] = 1_000,
    batches: Annotated[int, typer.Option("--batches", min=1, help="live micro-batches, one after the other")] = 5,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="also write the figures as JSON here")] = None,
    as_json: AsJson = False,
) -> None:
    """Live micro-batches of changed keys MERGEd into a large Delta table (deletion vectors on): seconds,
    Spark jobs, executor CPU, files touched and bytes written of each, the first and the median, next
    to a full rewrite of the table (the reference). Local Spark, no broker: the table's cost."""
    from orchestrator.dev.upsertbench import run_upsert_bench

    cli = cli_of(ctx)
    figures = run_upsert_bench(rows, changed, batches=batches, console=cli.err if as_json else cli.out)
    write_json(out, figures)
    if as_json:
        print_json(figures)
    elif out is not None:
        cli.out.print(f"wrote {out}")


@bench_app.command("deploy")
def bench_deploy(
    ctx: typer.Context,
    records: Annotated[int, typer.Option("--records", min=1, help="records in the log")] = 2_000_000,
    keys: Annotated[int, typer.Option("--keys", min=1, help="distinct keys")] = 500_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1, help="topic partitions")] = 4,
    value_size: Annotated[int, typer.Option("--value-size", min=50, help="bytes per value, about")] = 200,
    rules: Annotated[str, typer.Option("--rules", help="rules version")] = "v2",
    poll: Annotated[float, typer.Option("--poll", min=0.1, help="seconds between lag samples")] = 0.5,
    deadline: Annotated[float, typer.Option("--deadline", min=1, help="seconds to wait for catch-up at most")] = 3600.0,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="also write the figures as JSON here")] = None,
    as_json: AsJson = False,
) -> None:
    """Time from `deploy` to a finished `promote` over a fresh log (Spark start-up included), by phase.

    Runs on its own embedded broker in a temporary home, and stops everything it started.
    """
    from orchestrator.dev.bench import run_deploy_bench

    cli = cli_of(ctx)
    figures = run_deploy_bench(records, keys, partitions=partitions, value_size=value_size, rules=rules, poll=poll,
                               deadline=deadline, console=cli.err if as_json else cli.out, overrides=cli.overrides)
    write_json(out, figures)
    if as_json:
        print_json(figures)
    elif out is not None:
        cli.out.print(f"wrote {out}")


@bench_app.command("flip")
def bench_flip(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline whose alias to flip")] = "standardize",
    flips: Annotated[int, typer.Option("--flips", min=1, help="flips to time")] = 100,
    readers: Annotated[int, typer.Option("--readers", min=0, help="concurrent readers resolving the alias and reading the table")] = 4,
    reader_mode: Annotated[str, typer.Option("--reader-mode", help="readers as 'process'es or 'thread's")] = "process",
    versions: Annotated[Optional[str], typer.Option("--versions", help="the two versions to flip between, e.g. 1,2 (default: serving and previous)")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="also write the figures as JSON here")] = None,
    as_json: AsJson = False,
) -> None:
    """Flip latency (registry CAS + pointer publish) under concurrent readers; p50, p99, reader errors.

    Needs a pipeline whose alias has served two versions with tables, e.g. the demo's home:
    `kappa --home <demo home> bench flip`. The alias ends where it started.
    """
    from orchestrator.dev.flipbench import flip_benchmark

    cli = cli_of(ctx)
    pair = None
    if versions is not None:
        try:
            a, b = (int(x) for x in versions.split(","))
        except ValueError:
            raise typer.BadParameter("expected two version numbers, e.g. 1,2", param_hint="--versions") from None
        pair = (a, b)
    if not as_json:
        kind = "processes" if reader_mode == "process" else "threads"
        cli.out.print(f"flipping {pipeline}'s alias {flips} times under {readers} reader {kind}...")
    figures = flip_benchmark(cli.kappa(), pipeline, versions=pair, flips=flips, readers=readers,
                             reader_mode=reader_mode, actor=default_actor())
    write_json(out, figures)
    if as_json:
        print_json(figures)
        return
    cli.out.print(f"flip latency over {figures.get('flips')} flips: p50 {figures.get('p50_ms')} ms, "
                  f"p99 {figures.get('p99_ms')} ms; reader errors: {figures.get('reader_errors')}")
    cli.out.print(f"CPU: the flips took {figures.get('flipper_cpu_seconds')} s of this process's CPU in "
                  f"{figures.get('seconds')} s of wall time (no Spark: no executor CPU)")
    rest = {k: v for k, v in figures.items() if k not in ("p50_ms", "p99_ms", "reader_errors", "flips")}
    cli.out.print(to_json(rest), markup=False)
    if out is not None:
        cli.out.print(f"wrote {out}")
