"""The `kappa` app: global options, the state the commands share, and how errors end a command.

Every command is a thin layer over one verb of the control plane (`orchestrator.lifecycle.deploy`,
`promote`, `rollback`, ...): it resolves the settings (flag > environment > config file >
default, in `orchestrator.core.settings.resolve_settings`), calls the verb, and prints what it returned.
The verbs raise `KappaError`s whose messages already say what is wrong and how to fix it; the
CLI is the only place that turns them into one line on stderr and an exit code (`exit_code_of`:
0 ok, 1 error, 2 usage, 3 refused). Read commands (`pipelines`, `status`, `history`) print JSON
with `--json`.

Global options come before the command: `kappa --home /tmp/k status`. When no bootstrap servers
are configured, commands use the embedded broker that `kappa broker start` left running under
the kappa home (`<home>/broker.json`).
"""

from __future__ import annotations

import getpass
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from orchestrator.core.envvars import CATALOGUE
from orchestrator.core.exceptions import KappaError, is_refusal

if TYPE_CHECKING:
    from orchestrator.context import Kappa
    from orchestrator.core.settings import Settings

__all__ = ["Actor", "AsJson", "Cli", "EXIT_ERROR", "EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE", "KappaGroup", "KappaRootGroup",
           "Reason",
           "app", "cli_of", "default_actor", "error_line", "exit_code_of", "new_typer", "version_line"]

#: The exit codes scripts can rely on. Usage errors (an unknown command or option, a bad value) are
#: click's, 2. A refusal is kappa declining in the present state, with nothing changed: a version not
#: ready, a promote --dry-run or deploy --dry-run that would refuse, another version in flight, a
#: concurrent change, a protected version, a retire not confirmed (`orchestrator.core.exceptions.REFUSALS`).
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3

EXIT_CODES_HELP = ("Exit codes: 0 done; 1 error (something is wrong: a setting, a name, a service); "
                   "2 usage error; 3 refused (the present state forbids it and nothing was changed: a "
                   "version not ready, a --dry-run that would refuse, another version in flight, a concurrent "
                   "change, a protected version, a retire not confirmed).")


def error_line(e: BaseException) -> str:
    """The one line a KappaError becomes: its message, on one line."""
    text = " ".join(part.strip() for part in str(e).splitlines() if part.strip())
    return f"Error: {text or type(e).__name__}"


def exit_code_of(e: KappaError) -> int:
    """The exit code a KappaError ends a command with: EXIT_REFUSED for a refusal, else EXIT_ERROR."""
    return EXIT_REFUSED if is_refusal(e) else EXIT_ERROR


class KappaGroup(TyperGroup):
    """Turns every KappaError raised by a command into one line on stderr and its exit code (`exit_code_of`)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KappaError as e:
            typer.echo(error_line(e), err=True)
            raise typer.Exit(exit_code_of(e)) from None


class KappaRootGroup(KappaGroup):
    """The `kappa` group itself: its --help ends with every KAPPA_* variable kappa reads (the catalogue,
    `orchestrator.core.envvars`)."""

    def format_epilog(self, ctx, formatter) -> None:
        super().format_epilog(ctx, formatter)
        with formatter.section("Environment variables (flag > variable > config file > default)"):
            formatter.write_dl([(v.name, v.description) for v in CATALOGUE.values()], col_max=36)


def new_typer(*, add_completion: bool = False, cls: type[KappaGroup] = KappaGroup, **kw: Any) -> typer.Typer:
    """A command group whose KappaErrors end as one line on stderr (a bug keeps its plain traceback).

    Only the root app adds the shell completion options (`--install-completion`, `--show-completion`)."""
    return typer.Typer(cls=cls, no_args_is_help=True, add_completion=add_completion,
                       pretty_exceptions_enable=False, rich_markup_mode=None, **kw)


app = new_typer(name="kappa", add_completion=True, cls=KappaRootGroup, help=(
    "kappa: re-derive a streaming table from a compacted Kafka topic into a new version, watch it "
    "catch up, flip the serving alias atomically, roll back. Start with `kappa demo`.\n\n" + EXIT_CODES_HELP))


def version_line() -> str:
    """`kappa --version`: kappa's version (from the installed package) and those of what it runs on."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def of(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    try:
        own = version("kappa")
    except PackageNotFoundError:  # run from a source tree that is not installed
        from orchestrator import __version__ as own
    return (f"kappa {own} (Python {platform.python_version()}, pyspark {of('pyspark')}, "
            f"deltalake {of('deltalake')})")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


class Cli:
    """What the global options resolved to; builds Settings and the Kappa facade on first use."""

    def __init__(self, overrides: dict[str, Any], config_file: Path | None = None) -> None:
        self.overrides = {k: v for k, v in overrides.items() if v is not None}
        self.config_file = config_file
        self._settings: Settings | None = None
        self._kappa: Kappa | None = None
        from orchestrator.observe.progress import make_console

        self.out = make_console()
        self.err = make_console(stderr=True)

    def settings(self) -> Settings:
        if self._settings is None:
            from orchestrator.core.settings import resolve_settings
            from orchestrator.dev.broker_home import read_broker_file

            s = resolve_settings(self.config_file, **self.overrides)
            if s.bootstrap_servers is None:
                running = read_broker_file(s.home)
                if running is not None:
                    s = resolve_settings(self.config_file, **{**self.overrides,
                                                              "bootstrap_servers": running["bootstrap_servers"]})
            self._settings = s
        return self._settings

    def kappa(self) -> Kappa:
        if self._kappa is None:
            from orchestrator.context import Kappa

            self._kappa = Kappa(self.settings())
        return self._kappa

    def close(self) -> None:
        if self._kappa is not None:
            self._kappa.close()
            self._kappa = None


def cli_of(ctx: typer.Context) -> Cli:
    """The `Cli` of this invocation (a fresh one when a sub-app is invoked on its own, as tests do)."""
    obj = ctx.find_root().obj
    if not isinstance(obj, Cli):
        obj = Cli({})
        ctx.find_root().obj = obj
    return obj


def default_actor() -> str:
    """Who runs this command, for the audit log: the OS user."""
    try:
        return getpass.getuser()
    except Exception:  # no user database entry (some containers)
        return os.environ.get("USER") or f"uid{os.getuid()}"


@app.callback()
def _global(
    ctx: typer.Context,
    home: Annotated[Optional[Path], typer.Option("--home", help="kappa home (KAPPA_HOME; default ./.kappa)")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="config file (KAPPA_CONFIG; default <home>/kappa.toml)")] = None,
    registry_url: Annotated[Optional[str], typer.Option("--registry-url", help="registry database URL (KAPPA_REGISTRY_URL)")] = None,
    bootstrap_servers: Annotated[Optional[str], typer.Option("--bootstrap-servers", help="Kafka bootstrap servers (KAPPA_BOOTSTRAP_SERVERS; default: the embedded broker)")] = None,
    kafka_config: Annotated[Optional[str], typer.Option("--kafka-config", help="extra librdkafka settings as a JSON object (KAPPA_KAFKA_CONFIG)")] = None,
    pipelines_file: Annotated[Optional[Path], typer.Option("--pipelines-file", help="pipelines file (KAPPA_PIPELINES)")] = None,
    rules_location: Annotated[Optional[str], typer.Option("--rules-location", help="folder (or file:// URI) of <ruleset>/<version>.toml rules files (KAPPA_RULES; default: the shipped rules)")] = None,
    job_path: Annotated[Optional[str], typer.Option("--job-path", help="folders to import the pipelines' job modules from, ':'-separated (KAPPA_JOB_PATH)")] = None,
    warehouse: Annotated[Optional[str], typer.Option("--warehouse", help="Delta tables root: a path or a URI such as s3://bucket/wh (KAPPA_WAREHOUSE)")] = None,
    state_dir: Annotated[Optional[Path], typer.Option("--state-dir", help="run dirs, and checkpoints unless --checkpoints (KAPPA_STATE_DIR)")] = None,
    checkpoints: Annotated[Optional[str], typer.Option("--checkpoints", help="Spark checkpoints root: a path or a URI every executor reaches (KAPPA_CHECKPOINTS; default: the state dir)")] = None,
    group_prefix: Annotated[Optional[str], typer.Option("--group-prefix", help="consumer group prefix (KAPPA_GROUP_PREFIX)")] = None,
    spark_master: Annotated[Optional[str], typer.Option("--spark-master", help="Spark master for jobs (KAPPA_SPARK_MASTER)")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log what kappa does (INFO) to stderr")] = False,
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                          help="print kappa's version (and Python's, pyspark's, deltalake's) and exit")] = False,
) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.ERROR,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not verbose:
        logging.getLogger("kappa.kafka").setLevel(logging.CRITICAL)
    ctx.obj = Cli(dict(home=home, registry_url=registry_url, bootstrap_servers=bootstrap_servers,
                       kafka_config=kafka_config, pipelines_file=pipelines_file, rules_location=rules_location,
                       job_path=job_path, warehouse=warehouse,
                       state_dir=state_dir, checkpoints=checkpoints, group_prefix=group_prefix,
                       spark_master=spark_master),
                  config_file=config)
    ctx.call_on_close(ctx.obj.close)


Actor = Annotated[Optional[str], typer.Option("--actor", help="who does this, for the audit log (default: the OS user)")]
Reason = Annotated[Optional[str], typer.Option("--reason", help="why, for the audit log")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]
