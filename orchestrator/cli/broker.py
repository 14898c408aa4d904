"""`kappa broker start|stop|status`: the embedded Apache Kafka broker in the background of a kappa home.

Its data lives in `<home>/broker/` and outlives `stop`: a later `start` on the same home brings
back the same ports, topics and records. Later commands against the same home find the running
broker through `<home>/broker.json` (see `orchestrator.dev.broker_home`); `stop` ends it by its
recorded PID, and only if that PID is still the process that was started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.app import AsJson, app, cli_of, new_typer
from orchestrator.cli.render import print_json
from orchestrator.dev.broker_home import broker_file, read_broker_file, write_broker_file

__all__ = ["broker_app"]

broker_app = new_typer(help="The embedded Apache Kafka broker (one KRaft node), in the background for terminal use.")
app.add_typer(broker_app, name="broker")


@broker_app.command("start")
def broker_start(
    ctx: typer.Context,
    port: Annotated[int, typer.Option("--port", min=0, max=65535,
                                      help="port on 127.0.0.1 at the first start (0: a free one); later starts "
                                           "keep the port the broker's data was made with")] = 0,
    as_json: AsJson = False,
) -> None:
    """Start the embedded broker in the background; later commands find it through the kappa home."""
    from orchestrator.dev.broker import EmbeddedBroker

    cli = cli_of(ctx)
    home = Path(cli.settings().home)
    running = read_broker_file(home)
    if running is not None:
        msg = f"the embedded broker already runs at {running['bootstrap_servers']} (pid {running['pid']})"
        if as_json:
            print_json({**running, "started": False, "message": msg})
        else:
            cli.out.print(msg)
        return
    home.mkdir(parents=True, exist_ok=True)
    broker = EmbeddedBroker(home / "broker", port=port).start()
    data = write_broker_file(home, broker.proc.pid, broker.port, broker.log_path)
    broker.proc = None  # it outlives this command; `kappa broker stop` ends it by PID
    msg = (f"the embedded broker (Apache Kafka) runs at {data['bootstrap_servers']} (pid {data['pid']}, data in "
           f"{broker.data_dir}, log {broker.log_path}); stop it with `kappa broker stop`")
    if as_json:
        print_json({**data, "started": True, "message": msg})
    else:
        cli.out.print(msg)


@broker_app.command("stop")
def broker_stop(ctx: typer.Context) -> None:
    """Stop the background broker recorded under the kappa home, by its PID."""
    from orchestrator.jobctl.process import stop_process

    cli = cli_of(ctx)
    home = Path(cli.settings().home)
    path = broker_file(home)
    data = read_broker_file(home)
    if data is None:
        path.unlink(missing_ok=True)
        cli.out.print(f"no embedded broker runs for {home}")
        return
    stop_process(int(data["pid"]), data.get("created"), timeout=30)
    path.unlink(missing_ok=True)
    cli.out.print(f"stopped the embedded broker at {data['bootstrap_servers']} (pid {data['pid']}); its topics "
                  f"and records stay in {Path(home) / 'broker'} for the next `kappa broker start`")


@broker_app.command("status")
def broker_status(ctx: typer.Context, as_json: AsJson = False) -> None:
    """Whether the background broker runs, and where."""
    cli = cli_of(ctx)
    data = read_broker_file(cli.settings().home)
    if as_json:
        print_json({"running": data is not None, **(data or {})})
    elif data is None:
        cli.out.print("no embedded broker runs for this kappa home; start one with `kappa broker start`")
    else:
        cli.out.print(f"the embedded broker runs at {data['bootstrap_servers']} (pid {data['pid']})")
