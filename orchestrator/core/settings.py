"""Settings: where kappa keeps things and how it reaches Kafka, Spark and the registry.

One precedence, resolved by pydantic-settings in one function, `resolve_settings`:

    CLI flag  >  environment variable  >  config file (TOML)  >  default

The settings, their flags, environment variables and defaults are tabled at the end of this
docstring; the table is generated from the catalogue of every KAPPA_* variable,
`orchestrator.core.envvars`, which `kappa --help` lists too. The two numeric settings (seconds)
have no flag.

The config file is `--config FILE` (`config_file=`), else `KAPPA_CONFIG`, else `kappa.toml`
in the home directory (optional). It holds the same names as top-level keys, and
`[kafka_config]` as a table. Relative paths in the file are relative to the file's directory;
relative paths from flags and environment variables to the current directory. Every path in
a `Settings` is absolute, so a spawned job sees the same files whatever its working directory.
`warehouse`, `state_dir` and `registry_url` follow `home` unless set themselves.
Lag samples older than `lag_sample_retention_seconds` are deleted as new ones are stored (the
audit log is kept for good), and a readiness decision counts only samples taken within
`readiness_window_seconds` of the newest (`orchestrator.lifecycle.await_ready`).

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
typer passes for an option the user did not give). `Settings(...)` constructed directly (as tests
do) takes its arguments and defaults only: it reads neither the environment nor a config file.

How the layers are read: pydantic-settings' `InitSettingsSource` (the flags, `Settings(**flags)`),
`EnvSettingsSource` (each setting under its catalogued name, from `os.environ` or the injected
`env=`), `TomlConfigSettingsSource` (the config file) and a default for `home` under `cwd=`, in
that priority, through `Settings.settings_customise_sources`, which only `resolve_settings` arms.
Each layer's values are checked on their own (unknown keys and value types in the file, the
JSON of `kafka_config`) and recorded with their source, so that an error is one `ConfigError`
line naming the setting, where its value came from and how to fix it, and `source_of(field)`
answers where a value came from.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable

from pydantic import Field, PrivateAttr, SecretStr, ValidationError, field_serializer, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict,
                               TomlConfigSettingsSource)

from orchestrator.core.dburls import check_registry_url
from orchestrator.core.envvars import CATALOGUE, KAPPA_CONFIG, SETTINGS_VARS
from orchestrator.core.exceptions import ConfigError
from orchestrator.core.resources import default_pipelines_file
from orchestrator.core.secrets import is_secret_key, mask_url, reveal

__all__ = ["CLI_FLAGS", "CONFIG_ENV", "CONFIG_FILE_NAME", "ENV_VARS", "SECONDS_FIELDS", "Settings", "resolve_settings"]

CONFIG_ENV = KAPPA_CONFIG
CONFIG_FILE_NAME = "kappa.toml"

#: Each setting's environment variable, from the catalogue (`orchestrator.core.envvars`).
ENV_VARS: dict[str, str] = {v.setting: v.name for v in SETTINGS_VARS if v.setting}
#: Settings in seconds, set by environment variable or config file only (no CLI flag).
SECONDS_FIELDS = ("lag_sample_retention_seconds", "readiness_window_seconds")
CLI_FLAGS: dict[str, str] = {name: "--" + name.replace("_", "-") for name in ENV_VARS if name not in SECONDS_FIELDS}
PATH_FIELDS = ("home", "state_dir", "pipelines_file")
#: Locations handled by Spark and delta-rs: a local path (made absolute) or a URI kept as given.
LOCATION_FIELDS = ("warehouse", "checkpoints", "rules_location")

_GROUP_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


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


class Settings(BaseSettings):
    """Resolved settings. Build with `resolve_settings()`; `Settings(home=...)` is fine in tests.

    Constructed directly, it takes its arguments and defaults only (no environment, no config file).
    """

    model_config = SettingsConfigDict(frozen=True, extra="forbid", env_prefix="KAPPA_", case_sensitive=True,
                                      env_ignore_empty=True, enable_decoding=False, validate_default=False)

    home: Path
    warehouse: str
    state_dir: Path
    checkpoints: str | None = None
    registry_url: str
    bootstrap_servers: str | None = None
    kafka_config: dict[str, str | SecretStr] = {}
    group_prefix: str = "kappa"
    pipelines_file: Path = Field(default_factory=default_pipelines_file)
    rules_location: str | None = None
    job_path: str | None = None
    spark_master: str = "local[2]"
    lag_sample_retention_seconds: float = 3 * 86400.0
    readiness_window_seconds: float = 300.0

    _sources: dict[str, str] = PrivateAttr(default_factory=dict)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The arguments only, unless `resolve_settings` is resolving: then flags > environment > file > default."""
        resolution = _RESOLUTION.get()
        if resolution is None:
            return (init_settings,)
        return resolution.sources(settings_cls, init_settings)

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
            data["warehouse"] = str(home / "warehouse")
        if data.get("state_dir") is None:
            data["state_dir"] = home / "state"
        if data.get("registry_url") is None:
            data["registry_url"] = f"sqlite:///{home / 'registry.db'}"
        if data.get("pipelines_file") is None:
            data.pop("pipelines_file", None)
        return data

    @field_validator("home", "state_dir", "pipelines_file")
    @classmethod
    def _absolute_path(cls, v: Path) -> Path:
        return _absolute(v, Path.cwd())

    @field_validator(*LOCATION_FIELDS, mode="before")
    @classmethod
    def _check_location(cls, v: Any, info: Any) -> Any:
        return None if v is None else _location(v, Path.cwd(), local=info.field_name == "rules_location")

    @field_validator("registry_url")
    @classmethod
    def _check_registry_url(cls, v: str) -> str:
        return check_registry_url(v)

    @field_validator("job_path", mode="before")
    @classmethod
    def _check_job_path(cls, v: Any) -> str | None:
        return None if v is None else _folders(v, Path.cwd())

    @property
    def job_folders(self) -> list[str]:
        return [p for p in (self.job_path or "").split(os.pathsep) if p]

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
        """Every setting as the KAPPA_* environment variable `resolve_settings` reads (secrets revealed):
        for a child process (a job, an Airflow worker) that must resolve exactly these settings."""
        optional = ("bootstrap_servers", "checkpoints", "rules_location", "job_path")
        env = {ENV_VARS[f]: str(getattr(self, f)) for f in ENV_VARS if f not in ("kafka_config", *optional)}
        env.update({ENV_VARS[f]: getattr(self, f) for f in optional if getattr(self, f) is not None})
        if self.kafka_config:
            env[ENV_VARS["kafka_config"]] = self.kafka_config_json()
        return env

    def source_of(self, field: str) -> str:
        """Where a value came from: a CLI flag, an environment variable, the config file or default."""
        if field not in type(self).model_fields:
            raise ConfigError(f"unknown setting {field!r}; known: {', '.join(type(self).model_fields)}")
        return self._sources.get(field, "default")

    @property
    def config_file(self) -> Path | None:  # the config file `resolve_settings` read, if any
        found = self._sources.get("config_file")
        return Path(found) if found else None

    @field_serializer("registry_url", when_used="json")
    def _masked_in_json(self, v: str) -> str:
        """`model_dump(mode="json")` is for showing: the password is masked, as kafka_config's secrets are."""
        return mask_url(v)

    def __repr_args__(self):
        for name, value in super().__repr_args__():
            yield name, (mask_url(value) if name == "registry_url" else value)


def _location(value: Any, base: Path, local: bool = False) -> str:
    """A URI (normalized, never through pathlib), else an absolute path; `local`: no URI but file://."""
    from orchestrator.core import uris

    text = str(value)
    if not text.strip():
        raise ValueError("expected a local path or a URI such as s3://bucket/warehouse")
    if local and uris.scheme(text) not in (None, "file"):
        raise ValueError("rules are read from a local folder or a file:// URI; check them out to a folder")
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:/", text):   # a URI, or one whose `//` was lost (refused)
        try:
            return uris.normalize(text)
        except ConfigError as e:
            raise ValueError(str(e)) from None
    return str(_absolute(Path(text), base))


def _folders(value: Any, base: Path) -> str:
    """Folders (a list, or one string separated by os.pathsep), each made absolute against `base`."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(os.pathsep)
    return os.pathsep.join(str(_absolute(Path(str(p)), base)) for p in items if str(p).strip())


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
    if source.startswith("Airflow"):
        return f"fix {field!r} in the {source}"
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


def _check_file_values(path: Path, data: dict[str, Any]) -> None:
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
        elif key == "job_path" and isinstance(value, list) and all(isinstance(p, str) for p in value):
            pass  # folders relative to the file's folder
        elif not isinstance(value, str):
            raise ConfigError(f"config file {path}: setting {key!r} must be a string, got "
                              f"{type(value).__name__} {value!r}")


class _ConfigFile(TomlConfigSettingsSource):
    """The config file, read by pydantic-settings; a bad file is one line naming it and what to fix."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            data = super()._read_file(file_path)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {file_path} is not valid TOML: {e}") from None
        except OSError as e:
            raise ConfigError(f"config file {file_path} cannot be read: {e.strerror}") from None
        _check_file_values(file_path, data)
        return data


class _Environment(EnvSettingsSource):
    """Each setting under its catalogued variable (`ENV_VARS`), from `env`; empty ones count as unset.

    Values stay text (`enable_decoding=False`): `kafka_config`'s JSON is parsed by the layer, so a bad
    one is reported with our message."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._env = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k: v for k, v in self._env.items() if k.startswith(self.env_prefix) and v}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.env_vars.get(ENV_VARS[field_name]), field_name, False


class _Layer(PydanticBaseSettingsSource):
    """One layer of `resolve_settings` around a pydantic-settings source: its values checked on their
    own (kafka_config), paths made absolute against `base`, and each field's source recorded."""

    def __init__(self, settings_cls: type[BaseSettings], inner: PydanticBaseSettingsSource,
                 label: Callable[[str], str], base: Path, record: dict[str, list[str]]) -> None:
        super().__init__(settings_cls)
        self.inner, self.label, self.base, self.record = inner, label, base, record

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads the whole layer from `inner`

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field, value in self.inner().items():
            source = self.label(field)
            if field == "kafka_config":
                try:
                    value = _normalize_kafka_config(value)
                except ValueError as e:
                    raise ConfigError(f"invalid setting kafka_config (from {source}): {e}; "
                                      f"{_how_to_fix('kafka_config', source)}") from None
            elif field in PATH_FIELDS:
                value = _absolute(Path(value), self.base)
            elif field == "job_path":
                value = _folders(value, self.base)
            elif field in LOCATION_FIELDS:
                try:
                    value = _location(value, self.base, local=field == "rules_location")
                except ValueError as e:
                    raise ConfigError(f"invalid setting {field}={value!r} (from {source}): {e}; "
                                      f"{_how_to_fix(field, source)}") from None
            out[field] = value
            self.record.setdefault(field, []).append(source)
        return out


class _HomeDefault(PydanticBaseSettingsSource):
    """The default `home`, `<cwd>/.kappa`, for the `cwd` resolve_settings was given."""

    def __init__(self, settings_cls: type[BaseSettings], cwd: Path) -> None:
        super().__init__(settings_cls)
        self.cwd = cwd

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return {"home": self.cwd / ".kappa"}


class _Resolution:
    """What one `resolve_settings` call reads, and where each value came from (highest layer first)."""

    def __init__(self, env: Mapping[str, str], cwd: Path, file_path: Path | None,
                 override_sources: Mapping[str, str] | None = None) -> None:
        self.env, self.cwd, self.file_path = env, cwd, file_path
        self.override_sources = dict(override_sources or {})
        self.file_label = f"config file {file_path}" if file_path else ""
        self.record: dict[str, list[str]] = {}
        self.file = _ConfigFile(Settings, toml_file=file_path) if file_path else None

    def sources(self, settings_cls: type[BaseSettings],
                flags: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        layers: list[PydanticBaseSettingsSource] = [
            _Layer(settings_cls, flags, lambda f: self.override_sources.get(f) or CLI_FLAGS[f], self.cwd,
                   self.record),
            _Layer(settings_cls, _Environment(settings_cls, self.env), ENV_VARS.__getitem__, self.cwd, self.record)]
        if self.file is not None and self.file_path is not None:
            layers.append(_Layer(settings_cls, self.file, lambda _: self.file_label, self.file_path.parent,
                                 self.record))
        return (*layers, _HomeDefault(settings_cls, self.cwd))

    def source_of(self, field: str) -> str | None:
        found = self.record.get(field)
        if not found:
            return None
        return " + ".join(reversed(found)) if field == "kafka_config" else found[0]


_RESOLUTION: ContextVar[_Resolution | None] = ContextVar("kappa_settings_resolution", default=None)


def _problem(err: Any, resolution: _Resolution) -> str:
    field = str(err["loc"][0]) if err["loc"] else "settings"
    source = resolution.source_of(field) or "default"
    msg = err["msg"].removeprefix("Value error, ")
    shown = err.get("input")
    if field == "registry_url" and isinstance(shown, str):
        shown = mask_url(shown)
    return (f"invalid setting {field}={shown!r} (from {source}): {msg}; "
            f"{_how_to_fix(field, source) if field in ENV_VARS else ''}").rstrip("; ")


def resolve_settings(config_file: str | Path | None = None, *, env: Mapping[str, str] | None = None,
                     cwd: str | Path | None = None, override_sources: Mapping[str, str] | None = None,
                     **cli_overrides: Any) -> Settings:
    """Resolve every setting: CLI flag > environment variable > config file > default.

    `cli_overrides` are keyword arguments named like the settings (`home=`, `registry_url=`,
    `kafka_config=` as a dict or JSON text, ...); None means "flag not given". `env` defaults to
    `os.environ` and `cwd` to the current directory (both injectable for tests). `override_sources`
    names an override's source when it is no CLI flag ("Airflow Variable 'kappa_settings'")."""
    env = os.environ if env is None else env
    cwd_path = Path.cwd() if cwd is None else Path(cwd)
    unknown = sorted(set(cli_overrides) - set(CLI_FLAGS))
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; known settings: {', '.join(CLI_FLAGS)}")
    cli = {k: v for k, v in cli_overrides.items() if v is not None}

    file_path = _locate_config_file(config_file, env, cli, cwd_path)
    resolution = _Resolution(env, cwd_path, file_path, override_sources)
    token = _RESOLUTION.set(resolution)
    try:
        settings = Settings(**cli)
    except ValidationError as e:
        raise ConfigError("; ".join(_problem(err, resolution) for err in e.errors())) from None
    finally:
        _RESOLUTION.reset(token)
    for field in ENV_VARS:
        source = resolution.source_of(field)
        if source:
            settings._sources[field] = source
    if file_path:
        settings._sources["config_file"] = str(file_path)
    return settings


def _settings_table() -> str:
    rows = ["| setting | CLI flag | environment variable | default |", "|---|---|---|---|"]
    rows += [f"| `{v.setting}` | {f'`{CLI_FLAGS[v.setting]}`' if v.setting in CLI_FLAGS else '(none)'} "
             f"| `{v.name}` | {v.default} |" for v in SETTINGS_VARS if v.setting]
    return "\n".join(rows)


assert tuple(ENV_VARS) == tuple(Settings.model_fields), "the catalogue's settings follow Settings' fields"
assert all(name in CATALOGUE for name in ENV_VARS.values())
if __doc__:  # not under python -OO
    __doc__ += "\n" + _settings_table() + "\n"
