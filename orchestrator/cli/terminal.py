"""`kappa logs` (a version's job log, followed with -f) and `kappa resolve` (what an alias serves, for readers).

Both only read. The job log is the job's own output, not kappa's text: every secret of the settings
is masked in it (`orchestrator.core.secrets.mask_secrets`) before it is printed, line by line.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable

import typer

from orchestrator.cli.app import AsJson, app, cli_of
from orchestrator.cli.render import print_json
from orchestrator.core.exceptions import NotFoundError
from orchestrator.core.secrets import mask_secrets

if TYPE_CHECKING:
    from orchestrator.context import VersionRef

__all__ = ["follow_log", "last_lines"]

#: Seconds between two looks at a followed log (and at whether its job still lives).
FOLLOW_POLL_SECONDS = 0.5
#: How much of the log's end `last_lines` reads at most.
TAIL_BYTES = 1 << 20
#: The pause of a follow that found nothing new (a test replaces it to act between two looks).
_sleep = time.sleep


def last_lines(path: Path, n: int, *, complete_only: bool = False) -> tuple[list[str], int]:
    """The last `n` lines of `path` (read from at most its last TAIL_BYTES) and the offset after them, from
    where following goes on. `complete_only` leaves out a last line without its newline (a follow prints
    it once it is complete)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        start = max(0, size - TAIL_BYTES)
        f.seek(start)
        data = f.read(size - start)
    end = data.rfind(b"\n") + 1 if complete_only else len(data)
    lines = data[:end].decode("utf-8", "replace").splitlines()
    if start > 0 and lines:
        lines = lines[1:]         # the first one is likely cut
    return (lines[-n:] if n else []), start + end


def follow_log(path: Path, offset: int, alive: Callable[[], bool], emit: Callable[[str], None], *,
               poll: float = FOLLOW_POLL_SECONDS, sleep: Callable[[float], None] | None = None) -> int:
    """Print each line appended to `path` after `offset` until `alive()` is false, then what is left
    (a last line without a newline too). Returns the offset reached. A log that shrinks (replaced) is
    read again from its start."""
    pending = b""
    while True:
        running = alive()   # asked before reading: what a job wrote before it ended is still read below
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                if f.tell() < offset:
                    offset, pending = 0, b""
                f.seek(offset)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        offset += len(chunk)
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            emit(line.decode("utf-8", "replace"))
        if not running:
            if pending:
                emit(pending.decode("utf-8", "replace"))
            return offset
        if not chunk:
            (sleep or _sleep)(poll)


def _job_alive(v: VersionRef) -> Callable[[], bool]:
    from orchestrator.jobctl import inspect_version

    return lambda: inspect_version(v).alive


@app.command("logs")
def logs_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="pipeline name")],
    version: Annotated[int, typer.Argument(min=1, help="version whose job log to print")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing what the job writes, until it ends or Ctrl-C")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", min=0, help="how many of the last lines to print first")] = 40,
) -> None:
    """Print the end of a version's job log (secrets masked); with -f follow it while the job runs."""
    cli = cli_of(ctx)
    k = cli.kappa()
    v = k.version(pipeline, version)           # NotFoundError naming the declared pipelines or known versions
    path = v.paths.log_file
    alive = _job_alive(v)
    if not path.exists() and not (follow and alive()):
        raise NotFoundError(f"{pipeline} v{version} has no job log at {path}: its job has not been started "
                            f"(`kappa deploy` or `kappa rollback` starts it), or the version is retired")
    settings = k.settings

    def emit(line: str) -> None:
        typer.echo(mask_secrets(line, settings))

    shown, offset = last_lines(path, lines, complete_only=follow) if path.exists() else ([], 0)
    for line in shown:
        emit(line)
    if not follow:
        return
    try:
        follow_log(path, offset, alive, emit)
    except KeyboardInterrupt:
        pass  # Ctrl-C ends a follow as a job's end does: exit 0


@app.command("resolve")
def resolve_cmd(
    ctx: typer.Context,
    alias: Annotated[str, typer.Argument(help="serving alias, e.g. member_profiles_std (see `kappa pipelines`)")],
    as_json: AsJson = False,
) -> None:
    """What an alias serves: its table's location, pipeline version, Delta version and when it was published."""
    from orchestrator.observe.render import fmt_time
    from orchestrator.serving import describe_alias

    cli = cli_of(ctx)
    info = describe_alias(cli.kappa(), alias)
    if as_json:
        print_json(info)
        return
    rules = f" (rules {info.rules_version})" if info.rules_version else ""
    rows = [
        ("alias", info.alias),
        ("serves", f"{info.pipeline} v{info.version}{rules}"),
        ("table", info.table),
        ("delta", f"version {info.delta_version}, last commit {fmt_time(info.delta_committed_at)}"),
        ("published", fmt_time(info.published_at) if info.published_at is not None else
         f"not yet: no pointer at {info.pointer_file}"),
    ]
    if info.flipped_at is not None:
        prev = "nothing" if info.previous_version is None else f"v{info.previous_version}"
        rows.append(("flipped", f"{fmt_time(info.flipped_at)} by {info.flipped_by} from {prev}"
                                + (f": {info.reason}" if info.reason else "")))
    if info.pending_version is not None:
        rows.append(("pending", f"the registry serves v{info.pending_version}, not yet published; "
                                f"`kappa reconcile` publishes it"))
    for key, value in rows:
        cli.out.print(f"{key:<10}{value}", markup=False, soft_wrap=True)
