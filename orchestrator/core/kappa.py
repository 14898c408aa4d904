"""The facade every verb takes first: settings, registry, pipelines, paths and Kafka clients.

One `Kappa` object per process (CLI command, Airflow task, test) is enough: it opens the
registry (migrating it on first use), loads the pipelines file, and hands out one cached
AdminClient. Everything that depends on a broker connects lazily, so building a `Kappa`
never touches Kafka or Spark.

Public API:
- `Kappa(settings=None, *, registry=None, pipelines=None)`: `.settings`, `.registry`,
  `.pipelines` (dict name -> PipelineSpec), `.pipeline(name)`, `.paths(pipeline, n)`,
  `.kafka_config()`, `.admin()`, `.alias_file(alias)`, `.version_dir(pipeline, n)`, `.close()`.
- `.paths()` returns `orchestrator.core.settings.VersionPaths`: table, rejects, checkpoint, run_dir,
  group_id, app_id, and the files of the run dir (status.json, job.log, STOP), the version dir
  (report.json, launch.json).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from orchestrator.core.settings import VersionPaths
from orchestrator.core.exceptions import ConfigError, NotFoundError

log = logging.getLogger(__name__)

#: librdkafka logs (connection refused and the like) go to Python logging, not to stderr.
KAFKA_LOGGER = logging.getLogger("kappa.kafka")


class Kappa:
    """Settings, registry, pipelines and Kafka clients for one process.

    `registry` and `pipelines` may be injected (tests, the demo); otherwise they come from
    `settings.registry_url` and `settings.pipelines_file`.
    """

    def __init__(self, settings: Any = None, *, registry: Any = None,
                 pipelines: dict[str, Any] | None = None) -> None:
        if settings is None:
            from orchestrator.core.settings import resolve_settings

            settings = resolve_settings()
        self.settings = settings
        self._registry = registry
        self._pipelines = dict(pipelines) if pipelines is not None else None
        self._admin = None
        self._lock = threading.Lock()

    # -- registry and pipelines ---------------------------------------------------------------
    @property
    def registry(self):
        if self._registry is None:
            with self._lock:
                if self._registry is None:
                    from orchestrator.registry.store import Registry

                    self._registry = Registry(self.settings.registry_url)
        return self._registry

    @property
    def pipelines(self) -> dict[str, Any]:
        if self._pipelines is None:
            from orchestrator.core.pipelines import load_pipelines

            self._pipelines = dict(load_pipelines(self.settings.pipelines_file))
        return self._pipelines

    def pipeline(self, name: str):
        """The PipelineSpec named `name`; NotFoundError listing the declared ones."""
        spec = self.pipelines.get(name)
        if spec is None:
            known = ", ".join(sorted(self.pipelines)) or "none"
            raise NotFoundError(
                f"unknown pipeline {name!r}: the pipelines declared in "
                f"{self.settings.pipelines_file} are {known}; declare it there or pick one of those"
            )
        return spec

    def pipeline_for_alias(self, alias: str):
        for spec in self.pipelines.values():
            if spec.alias == alias:
                return spec
        raise NotFoundError(f"no pipeline declares the serving alias {alias!r} in "
                            f"{self.settings.pipelines_file}")

    # -- paths ------------------------------------------------------------------------------
    def version_dir(self, pipeline: str, n: int) -> Path:
        return self.paths(pipeline, n).version_dir

    def paths(self, pipeline: str, n: int) -> VersionPaths:
        from orchestrator.core.settings import version_paths

        return version_paths(self.settings, pipeline, n)

    def alias_file(self, alias: str) -> Path:
        from orchestrator.core.settings import alias_pointer_path

        return alias_pointer_path(self.settings, alias)

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

    def admin(self):
        """One AdminClient per Kappa (each holds threads and sockets)."""
        if self._admin is None:
            with self._lock:
                if self._admin is None:
                    from confluent_kafka.admin import AdminClient

                    self._admin = AdminClient(self.kafka_config(), logger=KAFKA_LOGGER)
        return self._admin

    def close(self) -> None:
        self._admin = None
        reg, self._registry = self._registry, None
        dispose = getattr(reg, "dispose", None) or getattr(reg, "close", None)
        if callable(dispose):
            try:
                dispose()
            except Exception:  # closing is best effort
                log.debug("registry close failed", exc_info=True)

    def __enter__(self) -> "Kappa":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
