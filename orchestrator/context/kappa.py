"""The facade every verb takes first, and the version handle it resolves once.

`Kappa`: one object per process (CLI command, Airflow task, test) is enough: it opens the registry
(migrating it on first use), loads the pipelines file, and hands out one cached AdminClient.
Everything that depends on a broker connects lazily, so building a `Kappa` never touches Kafka or
Spark.

`VersionRef` (`Kappa.version(pipeline, n)`): one version of one pipeline, resolved once at a verb's
entry and passed down. It holds what every layer below the verb needs: the pipeline's spec (looked
up by name once), the version number, its paths (derived once), its registry record as read when it
was resolved, and the `Kappa`. Nothing below the verb looks the spec up or derives the paths again.
The record is a snapshot: a verb that must see the registry as it is now (a compare-and-swap, a
state another process may have changed) says so with `reread()`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable

from orchestrator.core.exceptions import ConfigError, NotFoundError
from orchestrator.core.paths import VersionPaths, alias_pointer_path, version_paths
from orchestrator.core.pipelines import PipelineSpec, load_pipelines
from orchestrator.core.settings import Settings, resolve_settings

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

    from orchestrator.registry import Registry
    from orchestrator.registry.records import VersionRecord

__all__ = ["KAFKA_LOGGER", "Kappa", "VersionRef"]

log = logging.getLogger(__name__)

#: librdkafka logs (connection refused and the like) go to Python logging, not to stderr.
KAFKA_LOGGER = logging.getLogger("kappa.kafka")


class Kappa:
    """Settings, registry, pipelines and Kafka clients for one process.

    `registry` and `pipelines` may be injected (tests, the demo); otherwise they come from
    `settings.registry_url` and `settings.pipelines_file`.
    """

    def __init__(self, settings: Settings | None = None, *, registry: Registry | None = None,
                 pipelines: dict[str, PipelineSpec] | None = None) -> None:
        self.settings: Settings = resolve_settings() if settings is None else settings
        self._registry = registry
        self._pipelines = dict(pipelines) if pipelines is not None else None
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()
        self._auth_errors: list[str] = []

    # -- registry and pipelines ---------------------------------------------------------------
    @property
    def registry(self) -> Registry:
        if self._registry is None:
            with self._lock:
                if self._registry is None:
                    from orchestrator.registry import Registry

                    self._registry = Registry(self.settings.registry_url)
        return self._registry

    @property
    def pipelines(self) -> dict[str, PipelineSpec]:
        if self._pipelines is None:
            self._pipelines = dict(load_pipelines(self.settings.pipelines_file))
        return self._pipelines

    def pipeline(self, name: str) -> PipelineSpec:
        """The PipelineSpec named `name`; NotFoundError listing the declared ones."""
        spec = self.pipelines.get(name)
        if spec is None:
            known = ", ".join(sorted(self.pipelines)) or "none"
            raise NotFoundError(
                f"unknown pipeline {name!r}: the pipelines declared in "
                f"{self.settings.pipelines_file} are {known}; declare it there or pick one of those"
            )
        return spec

    def version(self, pipeline: str | PipelineSpec, n: int) -> VersionRef:
        """Resolve version `n` of `pipeline` once, for a verb's entry to pass down (`VersionRef`)."""
        return VersionRef.resolve(self, pipeline, n)

    def specs(self, names: Iterable[str] | None = None) -> list[PipelineSpec]:
        """The specs of the pipelines `names` names (all declared ones by default), each looked up once."""
        return [self.pipeline(n) for n in (self.pipelines if names is None else names)]

    def versions(self, pipeline: str | PipelineSpec, numbers: list[int] | None = None) -> list[VersionRef]:
        """The versions of `pipeline` (all of them, or those `numbers` name, in that order), resolved
        from one read of the registry; NotFoundError naming the versions it has."""
        spec = self.pipeline(pipeline) if isinstance(pipeline, str) else pipeline
        known = {rec.version: rec for rec in self.registry.list_versions(spec.name)}
        wanted = sorted(known) if numbers is None else list(numbers)
        for n in wanted:
            if n not in known:
                raise NotFoundError(
                    f"pipeline {pipeline!r} has no version {n}; it has "
                    f"{', '.join(f'v{m}' for m in sorted(known)) or 'none'} (see `kappa status {pipeline}`)")
        return [VersionRef.of_record(self, spec, known[n]) for n in wanted]

    # -- paths ------------------------------------------------------------------------------
    def paths(self, pipeline: str, n: int) -> VersionPaths:
        return version_paths(self.settings, pipeline, n)

    def alias_file(self, alias: str) -> str:
        """The location of the alias's pointer file (`orchestrator.core.uris`), under the warehouse."""
        return alias_pointer_path(self.settings.warehouse, alias)

    # -- Kafka ------------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        bs = self.settings.bootstrap_servers
        if not bs:
            raise ConfigError(
                "no Kafka bootstrap servers are configured: set KAPPA_BOOTSTRAP_SERVERS (or "
                "bootstrap_servers in kappa.toml, or --bootstrap-servers), or start the embedded "
                "stack with `kappa demo`"
            )
        return bs

    def kafka_config(self) -> dict[str, Any]:
        """librdkafka settings for any client: bootstrap servers plus `settings.kafka_config`."""
        return self.settings.kafka_client_config(**{"bootstrap.servers": self.bootstrap_servers})

    def admin(self) -> AdminClient:
        """One AdminClient per Kappa (each holds threads and sockets)."""
        if self._admin is None:
            with self._lock:
                if self._admin is None:
                    from confluent_kafka.admin import AdminClient

                    self._admin = AdminClient({**self.kafka_config(), "error_cb": self._on_kafka_error},
                                              logger=KAFKA_LOGGER)
        return self._admin

    def _on_kafka_error(self, err) -> None:
        """The admin client's errors: an authentication failure is kept to explain a failed call."""
        from confluent_kafka import KafkaError

        if err.code() == KafkaError._AUTHENTICATION and len(self._auth_errors) < 5:
            self._auth_errors.append(err.str())

    def authentication_failure(self) -> str | None:
        """The broker's last refusal of this Kappa's credentials, if any (serves pending callbacks)."""
        if self._admin is None:
            return None
        self._admin.poll(0)
        return self._auth_errors[-1] if self._auth_errors else None

    def close(self) -> None:
        self._admin = None
        reg, self._registry = self._registry, None
        if reg is not None:
            try:
                reg.close()
            except Exception:  # closing is best effort
                log.debug("registry close failed", exc_info=True)

    def __enter__(self) -> Kappa:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class VersionRef:
    """Version `version` of pipeline `spec.name`: spec, paths, record (as read at `resolve`), context."""

    k: Kappa
    spec: PipelineSpec
    paths: VersionPaths
    record: VersionRecord

    @classmethod
    def resolve(cls, k: Kappa, pipeline: str | PipelineSpec, version: int) -> VersionRef:
        """The one lookup: the spec by name (NotFoundError naming the declared pipelines), the paths,
        and the registry record (NotFoundError naming the pipeline's versions)."""
        spec = k.pipeline(pipeline) if isinstance(pipeline, str) else pipeline
        paths = k.paths(spec.name, version)      # validates the number before the registry is asked
        return cls(k=k, spec=spec, paths=paths, record=k.registry.get_version(spec.name, version))

    @classmethod
    def of_record(cls, k: Kappa, spec: PipelineSpec, record: VersionRecord) -> VersionRef:
        """The version of a record just read (a listing of the pipeline's versions): no second read."""
        return cls(k=k, spec=spec, paths=k.paths(spec.name, record.version), record=record)

    @property
    def version(self) -> int:
        return self.record.version

    @property
    def pipeline(self) -> str:
        return self.spec.name

    @property
    def settings(self) -> Settings:
        return self.k.settings

    @property
    def registry(self) -> Registry:
        return self.k.registry

    @property
    def alias(self) -> str:
        return self.spec.alias

    def reread(self) -> VersionRef:
        """The same version with its registry record read again: for a verb that decides on the
        record as it is now (a compare-and-swap, a state another process may have changed)."""
        return replace(self, record=self.k.registry.get_version(self.pipeline, self.version))

    def sibling(self, version: int) -> VersionRef:
        """Another version of the same pipeline (the serving one, the standby): the spec is shared,
        its paths and record are its own."""
        if version == self.version:
            return self
        return VersionRef.resolve(self.k, self.spec, version)

    def __str__(self) -> str:
        return f"{self.pipeline} v{self.version}"
