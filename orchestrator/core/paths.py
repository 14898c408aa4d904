"""Where a version writes and what it is called: the path and id contract of kappa.

Version N of a pipeline writes its table to `<warehouse>/<pipeline>/v<N>`, its rejects to
`<warehouse>/<pipeline>/v<N>__rejects`, its checkpoint to `<checkpoints>/<pipeline>/v<N>/checkpoint`
(`checkpoints` defaults to the state dir), its run files under `<state_dir>/<pipeline>/v<N>/`, reads
as consumer group `<group_prefix>.<pipeline>.v<N>` and commits to Delta as `kappa.<pipeline>.v<N>`.
A serving alias is published as the pointer file `<warehouse>/_aliases/<alias>.json`, which is all a
reader needs. Nothing is created here.

The table, the rejects table, the checkpoint and the pointer file are locations (`orchestrator.core.uris`):
URI strings (`s3://…`, `file:///…`) or plain absolute paths, which Spark and delta-rs take as they are,
so they may be on storage the cluster shares. The run files are the driver's own: local Paths.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from orchestrator.core import uris
from orchestrator.core.names import validate_alias_name, validate_pipeline_name, validate_version_number
from orchestrator.core.settings import Settings

__all__ = ["ALIASES_DIR", "VersionPaths", "alias_pointer_path", "app_id", "checkpoint_root", "version_paths"]

#: The folder of the warehouse that holds the alias pointer files.
ALIASES_DIR = "_aliases"


class VersionPaths(BaseModel):
    """Everything version N of a pipeline writes to, and the ids it uses."""

    model_config = ConfigDict(frozen=True)

    pipeline: str
    version: int
    #: Locations (URI strings or absolute paths, `orchestrator.core.uris`): never pathlib.
    table: str
    rejects: str
    version_dir: Path
    checkpoint: str
    run_dir: Path
    group_id: str
    app_id: str

    @property
    def status_file(self) -> Path:
        return self.run_dir / "status.json"

    @property
    def log_file(self) -> Path:
        return self.run_dir / "job.log"

    @property
    def stop_file(self) -> Path:
        return self.run_dir / "STOP"

    @property
    def report_file(self) -> Path:
        return self.version_dir / "report.json"

    @property
    def launch_file(self) -> Path:
        """What job control launched (command line, mode, PID): read by inspect and restart."""
        return self.version_dir / "launch.json"


def checkpoint_root(settings: Settings) -> str:
    """Where the checkpoints go: `settings.checkpoints` when it is set (a URI on shared storage for a
    cluster, whose executors read the checkpoint's offset log), else the state dir."""
    root = getattr(settings, "checkpoints", None)
    return uris.normalize(root if root else settings.state_dir)


def app_id(pipeline: str, version: int | str) -> str:
    """The Delta application id of a pipeline version, `kappa.<pipeline>.v<N>`: the sink records each committed
    batch under it, so a restarted job skips what is already in. The one definition (the jobs import it)."""
    return f"kappa.{pipeline}.v{version}"


def version_paths(settings: Settings, pipeline: str, n: int) -> VersionPaths:
    """Table, rejects table, checkpoint, run dir, consumer group and Delta app id of version N."""
    validate_pipeline_name(pipeline)
    validate_version_number(n)
    vdir = settings.state_dir / pipeline / f"v{n}"
    return VersionPaths(
        pipeline=pipeline,
        version=n,
        table=uris.join(settings.warehouse, pipeline, f"v{n}"),
        rejects=uris.join(settings.warehouse, pipeline, f"v{n}__rejects"),
        version_dir=vdir,
        checkpoint=uris.join(checkpoint_root(settings), pipeline, f"v{n}", "checkpoint"),
        run_dir=vdir / "run",
        group_id=f"{settings.group_prefix}.{pipeline}.v{n}",
        app_id=app_id(pipeline, n),
    )


def alias_pointer_path(warehouse: str | Path, alias: str) -> str:
    """The pointer file readers of `alias` follow: `<warehouse>/_aliases/<alias>.json` (a location)."""
    validate_alias_name(alias)
    return uris.join(warehouse, ALIASES_DIR, f"{alias}.json")
