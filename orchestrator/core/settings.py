"""Settings: where kappa keeps things and how it reaches Kafka, Spark and the registry.

One precedence, resolved in one function, `resolve_settings`:

    CLI flag  >  environment variable  >  config file (TOML)  >  default

| setting             | CLI flag              | environment variable      | default                          |
|---------------------|-----------------------|---------------------------|----------------------------------|
| `home`              | `--home`              | `KAPPA_HOME`              | `<cwd>/.kappa`                   |
| `warehouse`         | `--warehouse`         | `KAPPA_WAREHOUSE`         | `<home>/warehouse`               |
| `state_dir`         | `--state-dir`         | `KAPPA_STATE_DIR`         | `<home>/state`                   |
| `registry_url`      | `--registry-url`      | `KAPPA_REGISTRY_URL`      | `sqlite:///<home>/registry.db`   |
| `bootstrap_servers` | `--bootstrap-servers` | `KAPPA_BOOTSTRAP_SERVERS` | None (the embedded broker)       |
| `kafka_config`      | `--kafka-config`      | `KAPPA_KAFKA_CONFIG`      | `{}` (JSON object / TOML table)  |
| `group_prefix`      | `--group-prefix`      | `KAPPA_GROUP_PREFIX`      | `kappa`                          |
| `pipelines_file`    | `--pipelines-file`    | `KAPPA_PIPELINES`         | the shipped `pipelines.toml`     |
| `spark_master`      | `--spark-master`      | `KAPPA_SPARK_MASTER`      | `local[2]`                       |
| `lag_sample_retention_seconds` | (none) | `KAPPA_LAG_SAMPLE_RETENTION_SECONDS` | `259200` (3 days)   |
| `readiness_window_seconds`     | (none) | `KAPPA_READINESS_WINDOW_SECONDS`     | `300`               |

The config file is `--config FILE` (`config_file=`), else `KAPPA_CONFIG`, else `kappa.toml`
in the home directory (optional). It holds the same names as top-level keys, and
`[kafka_config]` as a table. Relative paths in the file are relative to the file's directory;
relative paths from flags and environment variables to the current directory. Every path in
a `Settings` is absolute, so a spawned job sees the same files whatever its working directory.
`warehouse`, `state_dir` and `registry_url` follow `home` unless set themselves.
The two numeric settings (seconds) have no flag: lag samples older than
`lag_sample_retention_seconds` are deleted as new ones are stored (the audit log is kept for
good), and a readiness decision counts only samples taken within `readiness_window_seconds`
of the newest (`orchestrator.lifecycle.await_ready`).

`kafka_config` is merged key by key (file, then environment, then flags), so a flag can
override one librdkafka setting without repeating the others. Values are strings (librdkafka
parses them); keys that hold secrets (`sasl.password`, `ssl.key.password`, `*.secret`, ...) are
kept as `SecretStr` (see `orchestrator.core.secrets`) and masked in repr and in
`model_dump(mode="json")`. The registry URL's password is masked the same way.
`kafka_client_config()` / `kafka_config_json()` reveal them, for the clients that need them.

The default pipelines file is `deploy/pipelines.toml` of a checkout, or the copy a regular install
ships (`orchestrator.core.resources.default_pipelines_file`). A version's paths are in
`orchestrator.core.paths`.

Empty environment variables count as unset. CLI overrides that are None count as unset (what
typer passes for an option the user did not give).
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError, field_serializer,
                      field_validator, model_validator)

from orchestrator.core.exceptions import ConfigError
from orchestrator.core.resources import default_pipelines_file
from orchestrator.core.secrets import is_secret_key, mask_url, reveal

__all__ = ["CLI_FLAGS", "CONFIG_ENV", "CONFIG_FILE_NAME", "ENV_VARS", "SECONDS_FIELDS", "Settings", "resolve_settings"]

CONFIG_ENV = "KAPPA_CONFIG"
CONFIG_FILE_NAME = "kappa.toml"

ENV_VARS: dict[str, str] = {
    "home": "KAPPA_HOME",
    "warehouse": "KAPPA_WAREHOUSE",
    "state_dir": "KAPPA_STATE_DIR",
    "registry_url": "KAPPA_REGISTRY_URL",
    "bootstrap_servers": "KAPPA_BOOTSTRAP_SERVERS",
    "kafka_config": "KAPPA_KAFKA_CONFIG",
    "group_prefix": "KAPPA_GROUP_PREFIX",
    "pipelines_file": "KAPPA_PIPELINES",
    "spark_master": "KAPPA_SPARK_MASTER",
    "lag_sample_retention_seconds": "KAPPA_LAG_SAMPLE_RETENTION_SECONDS",
    "readiness_window_seconds": "KAPPA_READINESS_WINDOW_SECONDS",
}
#: Settings in seconds, set by environment variable or config file only (no CLI flag).
SECONDS_FIELDS = ("lag_sample_retention_seconds", "readiness_window_seconds")
CLI_FLAGS: dict[str, str] = {name: "--" + name.replace("_", "-") for name in ENV_VARS if name not in SECONDS_FIELDS}
PATH_FIELDS = ("home", "warehouse", "state_dir", "pipelines_file")

_GROUP_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_REGISTRY_URL_HINT = "expected sqlite:///<path> or postgresql+psycopg2://<user>[:<password>]@<host>:<port>/<db>"


def _kafka_value(key: str, value: Any) -> str | SecretStr:
    if isinstance(value, SecretStr):
        return value if is_secret_key(key) else value.get_secret_value()
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (str, int, float)):
        text = str(value)
    else:
        raise ValueError(f"kafka_config[{key!r}] must be a string, number or boolean, "
                         f"got {type(value).__name__}")
    return SecretStr(text) if is_secret_key(key) else text


def _normalize_kafka_config(v: Any) -> dict[str, str | SecretStr]:
    if isinstance(v, str):
        v = _parse_json_object(v)
    if not isinstance(v, Mapping):
        raise ValueError("expected a mapping of librdkafka settings, e.g. "
                         '{"security.protocol": "SASL_SSL"}')
    out: dict[str, str | SecretStr] = {}
    for key, value in v.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"librdkafka setting names are non-empty strings, got {key!r}")
        out[key] = _kafka_value(key, value)
    return out


class Settings(BaseModel):
    """Resolved settings. Build with `resolve_settings()`; `Settings(home=...)` is fine in tests."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    home: Path
    warehouse: Path
    state_dir: Path
    registry_url: str
    bootstrap_servers: str | None = None
    kafka_config: dict[str, str | SecretStr] = {}
    group_prefix: str = "kappa"
    pipelines_file: Path = Field(default_factory=default_pipelines_file)
    spark_master: str = "local[2]"
    lag_sample_retention_seconds: float = 3 * 86400.0
    readiness_window_seconds: float = 300.0

    _sources: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _derive_from_home(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("home") is None:
            data["home"] = Path.cwd() / ".kappa"
        home = _absolute(Path(data["home"]), Path.cwd())
        data["home"] = home
        if data.get("warehouse") is None:
            data["warehouse"] = home / "warehouse"
        if data.get("state_dir") is None:
            data["state_dir"] = home / "state"
        if data.get("registry_url") is None:
            data["registry_url"] = f"sqlite:///{home / 'registry.db'}"
        if data.get("pipelines_file") is None:
            data.pop("pipelines_file", None)
        return data

    @field_validator("home", "warehouse", "state_dir", "pipelines_file")
    @classmethod
    def _absolute_path(cls, v: Path) -> Path:
        return _absolute(v, Path.cwd())

    @field_validator("registry_url")
    @classmethod
    def _check_registry_url(cls, v: str) -> str:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        from orchestrator.registry.engine import DRIVERS

        try:
            url = make_url(v)
        except ArgumentError:
            raise ValueError(f"not a database URL; {_REGISTRY_URL_HINT}") from None
        backend, _, driver = url.drivername.partition("+")
        backend = "postgresql" if backend == "postgres" else backend
        if backend not in DRIVERS:
            raise ValueError(f"the registry runs on SQLite or PostgreSQL, not {backend}; {_REGISTRY_URL_HINT}")
        if driver and driver != DRIVERS[backend]:
            plain = url.set(drivername=backend).render_as_string(hide_password=True)
            raise ValueError(f"kappa connects to {backend} with {DRIVERS[backend]} and does not install the "
                             f"driver {driver!r}; write {plain}")
        if backend == "postgresql":  # postgresql:// and postgres:// mean psycopg2, not SQLAlchemy's psycopg 3
            return url.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
        return v

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_bootstrap(cls, v: str | None) -> str | None:
        if v is None:
            return None
        parts = [p.strip() for p in v.split(",")]
        if not v.strip() or any(not p or any(c.isspace() for c in p) for p in parts):
            raise ValueError("expected a comma-separated list of host:port, e.g. 127.0.0.1:9092")
        return ",".join(parts)

    @field_validator("kafka_config", mode="before")
    @classmethod
    def _secret_kafka_values(cls, v: Any) -> Any:
        return _normalize_kafka_config(v)

    @field_validator("group_prefix")
    @classmethod
    def _check_group_prefix(cls, v: str) -> str:
        if _GROUP_PREFIX.fullmatch(v) is None:
            raise ValueError("must be 1 to 100 characters from A-Z, a-z, 0-9, '.', '_', '-', "
                             "starting with a letter or digit")
        return v

    @field_validator("spark_master")
    @classmethod
    def _check_master(cls, v: str) -> str:
        if not v.strip() or any(c.isspace() for c in v):
            raise ValueError("expected a Spark master URL such as local[2] or spark://127.0.0.1:7077")
        return v

    @field_validator(*SECONDS_FIELDS, mode="before")
    @classmethod
    def _check_seconds(cls, v: Any) -> float:
        try:
            seconds = float(v)
        except (TypeError, ValueError):
            seconds = float("nan")
        if isinstance(v, bool) or not seconds > 0 or seconds == float("inf"):
            raise ValueError("expected a positive number of seconds, e.g. 3600")
        return seconds

    # -- derived values ---------------------------------------------------------------------

    @property
    def masked_registry_url(self) -> str:
        return mask_url(self.registry_url)

    def kafka_client_config(self, **extra: Any) -> dict[str, Any]:
        """librdkafka config with secrets revealed and `bootstrap.servers` if set; `extra` wins."""
        conf: dict[str, Any] = {k: reveal(v) for k, v in self.kafka_config.items()}
        if self.bootstrap_servers is not None:
            conf["bootstrap.servers"] = self.bootstrap_servers
        conf.update(extra)
        return conf

    def kafka_config_json(self) -> str:
        """`kafka_config` as JSON with secrets revealed (the job's `--kafka-config`)."""
        return json.dumps({k: reveal(v) for k, v in self.kafka_config.items()}, sort_keys=True)

    def to_env(self) -> dict[str, str]:
        """Every setting as the KAPPA_* environment variable `resolve_settings` reads (secrets revealed).

        For a child process (a job, an Airflow worker) that must resolve exactly these settings.
        """
        env = {ENV_VARS[f]: str(getattr(self, f)) for f in ENV_VARS
               if f not in ("kafka_config", "bootstrap_servers")}
        if self.bootstrap_servers is not None:
            env[ENV_VARS["bootstrap_servers"]] = self.bootstrap_servers
        if self.kafka_config:
            env[ENV_VARS["kafka_config"]] = self.kafka_config_json()
        return env

    def source_of(self, field: str) -> str:
        """Where a value came from: a CLI flag, an environment variable, the config file or default."""
        if field not in type(self).model_fields:
            raise ConfigError(f"unknown setting {field!r}; known: {', '.join(type(self).model_fields)}")
        return self._sources.get(field, "default")

    @property
    def config_file(self) -> Path | None:
        """The config file `resolve_settings` read, if any."""
        found = self._sources.get("config_file")
        return Path(found) if found else None

    @field_serializer("registry_url", when_used="json")
    def _masked_in_json(self, v: str) -> str:
        """`model_dump(mode="json")` is for showing: the password is masked, as kafka_config's secrets are."""
        return mask_url(v)

    def __repr_args__(self):
        for name, value in super().__repr_args__():
            yield name, (mask_url(value) if name == "registry_url" else value)


def _absolute(p: Path, base: Path) -> Path:
    p = p.expanduser()
    if not p.is_absolute():
        p = base / p
    return Path(os.path.normpath(p))


def _parse_json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); expected an "
                         'object such as {"security.protocol": "SASL_SSL"}') from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


# -- resolution ---------------------------------------------------------------------------------

def _how_to_fix(field: str, source: str) -> str:
    if source.startswith("--"):
        return f"fix the {source} flag"
    if source.startswith("KAPPA_"):
        return f"fix or unset the environment variable {source}"
    if source.startswith("config file"):
        return f"fix {field!r} in the {source[len('config file '):]}"
    flag = f"{CLI_FLAGS[field]}, " if field in CLI_FLAGS else ""
    return f"set it with {flag}{ENV_VARS[field]} or {field!r} in {CONFIG_FILE_NAME}"


def _locate_config_file(config_file: str | Path | None, env: Mapping[str, str], cli: dict[str, Any],
                        cwd: Path) -> Path | None:
    if config_file is not None:
        path = _absolute(Path(config_file), cwd)
        if not path.is_file():
            raise ConfigError(f"config file {path} (from --config) does not exist; "
                              f"fix the path or drop --config")
        return path
    if env.get(CONFIG_ENV):
        path = _absolute(Path(env[CONFIG_ENV]), cwd)
        if not path.is_file():
            raise ConfigError(f"config file {path} (from {CONFIG_ENV}) does not exist; "
                              f"fix or unset {CONFIG_ENV}")
        return path
    home = cli.get("home") or env.get(ENV_VARS["home"]) or (cwd / ".kappa")
    path = _absolute(Path(home), cwd) / CONFIG_FILE_NAME
    return path if path.is_file() else None


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror}") from None
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in ENV_VARS:
            raise ConfigError(f"config file {path}: unknown setting {key!r}; known settings: "
                              f"{', '.join(ENV_VARS)}")
        if key == "kafka_config":
            if not isinstance(value, dict):
                raise ConfigError(f"config file {path}: 'kafka_config' must be a table "
                                  f'([kafka_config] with "security.protocol" = "SASL_SSL" ...), '
                                  f"got {type(value).__name__}")
        elif key in SECONDS_FIELDS and isinstance(value, (int, float)) and not isinstance(value, bool):
            pass
        elif not isinstance(value, str):
            raise ConfigError(f"config file {path}: setting {key!r} must be a string, got "
                              f"{type(value).__name__} {value!r}")
        if key in PATH_FIELDS:
            value = _absolute(Path(value), path.parent)
        out[key] = value
    return out


def resolve_settings(config_file: str | Path | None = None, *, env: Mapping[str, str] | None = None,
                     cwd: str | Path | None = None, **cli_overrides: Any) -> Settings:
    """Resolve every setting: CLI flag > environment variable > config file > default.

    `cli_overrides` are keyword arguments named like the settings (`home=`, `registry_url=`,
    `kafka_config=` as a dict or JSON text, ...); None means "flag not given". `env` defaults to
    `os.environ` and `cwd` to the current directory (both injectable for tests).
    """
    env = os.environ if env is None else env
    cwd_path = Path.cwd() if cwd is None else Path(cwd)
    unknown = sorted(set(cli_overrides) - set(CLI_FLAGS))
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; known settings: {', '.join(CLI_FLAGS)}")
    cli = {k: v for k, v in cli_overrides.items() if v is not None}

    file_path = _locate_config_file(config_file, env, cli, cwd_path)
    from_file = _read_config_file(file_path) if file_path else {}
    file_label = f"config file {file_path}" if file_path else ""

    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for field, var in ENV_VARS.items():
        if field == "kafka_config":
            continue
        if field in cli:
            value, source = cli[field], CLI_FLAGS[field]
            if field in PATH_FIELDS:
                value = _absolute(Path(value), cwd_path)
        elif env.get(var):
            value, source = env[var], var
            if field in PATH_FIELDS:
                value = _absolute(Path(value), cwd_path)
        elif field in from_file:
            value, source = from_file[field], file_label
        else:
            continue
        values[field] = value
        sources[field] = source
    if "home" not in values:
        values["home"] = cwd_path / ".kappa"

    # kafka_config: merged key by key, each layer validated on its own so errors name their source
    kafka: dict[str, Any] = {}
    kafka_sources: list[str] = []
    layers = [(from_file.get("kafka_config"), file_label)]
    if env.get(ENV_VARS["kafka_config"]):
        layers.append((env[ENV_VARS["kafka_config"]], ENV_VARS["kafka_config"]))
    if "kafka_config" in cli:
        layers.append((cli["kafka_config"], CLI_FLAGS["kafka_config"]))
    for layer, source in layers:
        if layer is None:
            continue
        try:
            kafka.update(_normalize_kafka_config(layer))
        except ValueError as e:
            raise ConfigError(f"invalid setting kafka_config (from {source}): {e}; "
                              f"{_how_to_fix('kafka_config', source)}") from None
        kafka_sources.append(source)
    values["kafka_config"] = kafka
    if kafka_sources:
        sources["kafka_config"] = " + ".join(kafka_sources)

    try:
        settings = Settings(**values)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else "settings"
            source = sources.get(field, "default")
            msg = err["msg"].removeprefix("Value error, ")
            shown = values.get(field)
            if field == "registry_url" and isinstance(shown, str):
                shown = mask_url(shown)
            problems.append(f"invalid setting {field}={shown!r} (from {source}): {msg}; "
                            f"{_how_to_fix(field, source) if field in ENV_VARS else ''}".rstrip("; "))
        raise ConfigError("; ".join(problems)) from None
    settings._sources.update(sources)
    if file_path:
        settings._sources["config_file"] = str(file_path)
    return settings
