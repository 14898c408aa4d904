"""`kappa bench reprocess|deploy|flip`: the benchmarks behind the README's figures.

Each runs the code in `orchestrator.dev` and prints its figures (with `--out`, also into a JSON
file). `reprocess` and `deploy` start their own embedded broker unless told otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from orchestrator.cli.app import AsJson, app, cli_of, default_actor, new_typer
from orchestrator.cli.render import print_json, to_json, write_json

__all__ = ["bench_app"]

bench_app = new_typer(help="Benchmarks: reprocess throughput, deploy-to-promote time, flip latency.")
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
    use_configured_broker: Annotated[bool, typer.Option("--use-configured-broker", help="produce to the configured bootstrap servers instead of a fresh embedded broker")] = False,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="check the output's raw columns and rejects against the generated records")] = True,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="also write the figures as JSON here")] = None,
) -> None:
    """Full standardize reprocess from offset zero against a raw consumer: records/s, MB/s, start-up, memory."""
    from orchestrator.dev.bench import run_reprocess_bench

    cli = cli_of(ctx)
    settings = cli.settings()
    bootstrap = kafka_config = None
    if use_configured_broker:
        k = cli.kappa()
        bootstrap, kafka_config = k.bootstrap_servers, k.settings.kafka_client_config()
        kafka_config.pop("bootstrap.servers", None)
    run_reprocess_bench(records, keys, partitions, value_size, out, max_records_per_batch=max_records_per_batch,
                        rules_version=rules, malformed_share=malformed_share, bootstrap=bootstrap,
                        kafka_config=kafka_config or None, master=settings.spark_master, verify=verify,
                        console=cli.out)
    if out is not None:
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
    rest = {k: v for k, v in figures.items() if k not in ("p50_ms", "p99_ms", "reader_errors", "flips")}
    cli.out.print(to_json(rest), markup=False)
    if out is not None:
        cli.out.print(f"wrote {out}")
