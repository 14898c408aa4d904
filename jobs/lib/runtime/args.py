"""A job's command line: the arguments every kappa job takes (see `jobs.lib.runtime`).

The Kafka config reaches a job as `--kafka-config-file` (a JSON object in a file only its owner
may read; kappa writes `<version_dir>/kafka.json`, mode 0600). `--kafka-config` (JSON on the
command line) takes settings that are not secret and overrides the file's; a secret there
(`sasl.password`, ...) is refused, because any user can read a command line in /proc/<pid>/cmdline.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
from typing import Callable

from orchestrator.core.exceptions import ConfigError
from orchestrator.core.secrets import is_secret_key

__all__ = ["TRIGGER_SECONDS", "build_parser", "parse_args", "read_kafka_config_file"]

#: The live trigger's interval (``--interval-seconds``): a micro-batch may start this often, and
#: readiness counts lag samples of an idle job at least this far apart.
TRIGGER_SECONDS = 1.0


def _json_object(what: str) -> Callable[[str], dict]:
    def parse(raw: str) -> dict:
        try:
            v = json.loads(raw)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"{what} must be a JSON object: {e}") from None
        if not isinstance(v, dict):
            raise argparse.ArgumentTypeError(f"{what} must be a JSON object, got {type(v).__name__}")
        return v
    return parse


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(raw: str) -> int | float:
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
    p.add_argument("--interval-seconds", type=_positive(float), default=TRIGGER_SECONDS)
    p.add_argument("--kafka-config", type=_json_object("--kafka-config"), default={},
                   help="librdkafka settings that are not secret, as a JSON object")
    p.add_argument("--kafka-config-file", default=None,
                   help="librdkafka settings, secrets included, as a JSON object in a file of mode 0600")
    p.add_argument("--master", default=None)
    p.add_argument("--extra", type=_json_object("--extra"), default={},
                   help='job-specific options; "source_options" (object) is passed to the Kafka source')
    p.add_argument("--job", default=None, help="the job's function, module:function (python -m jobs.run)")
    p.add_argument("--job-path", default="", help=f"folders to import the job from, {os.pathsep}-separated")
    p.add_argument("--key", default=None, help="the pipeline's key column(s), comma-separated")
    return p


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    """The parsed arguments with the derived ``topics_list`` and the defaults of ``--rejects`` and
    ``--group-id`` filled in; ConfigError when ``--topics`` names no topic."""
    args = build_parser(prog).parse_args(argv)
    args.topics_list = [t.strip() for t in args.topics.split(",") if t.strip()]
    if not args.topics_list:
        raise ConfigError("--topics must name at least one topic")
    if args.rejects is None:
        args.rejects = args.output.rstrip("/") + "__rejects"
    if args.group_id is None:
        args.group_id = f"kappa.{args.pipeline}.v{args.version}"
    secret = sorted(key for key in args.kafka_config if is_secret_key(key))
    if secret:
        raise ConfigError(f"--kafka-config holds the secret setting(s) {', '.join(secret)}, which any user can "
                          f"read on the command line; put them in a JSON file of mode 0600 and pass "
                          f"--kafka-config-file")
    if args.kafka_config_file:
        args.kafka_config = {**read_kafka_config_file(args.kafka_config_file), **args.kafka_config}
    return args


def read_kafka_config_file(path: str) -> dict[str, str]:
    """The JSON object in `path`; ConfigError (naming the file, never its content) when it is
    missing, readable by others than its owner, or not a JSON object."""
    try:
        with open(path, encoding="utf-8") as f:
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
            raw = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read the Kafka config file {path}: {e.strerror}; restart the version with "
                          f"kappa, which writes it") from None
    if mode & 0o077:
        raise ConfigError(f"the Kafka config file {path} is readable by others (mode {mode:04o}); it may hold "
                          f"secrets: `chmod 600 {path}`")
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ConfigError(f"the Kafka config file {path} is not a JSON object; restart the version with kappa, "
                          f"which rewrites it")
    return {str(k): str(v) for k, v in value.items()}
