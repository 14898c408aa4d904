"""What the registry returns: one frozen record per row, with the table's column names.

Times are unix seconds (float, UTC). `model_dump(mode="json")` is the JSON form the CLI and the
Airflow tasks print; a version's dump also says whether it is `in_flight`.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, computed_field, field_validator

from orchestrator.core.states import IN_FLIGHT, VersionState

__all__ = ["AliasHistoryRecord", "AliasRecord", "AuditRecord", "LagSampleRecord", "PipelineRecord",
           "VersionRecord"]


class _Record(BaseModel):
    """`Record.model_validate(row)` reads a SQLAlchemy row of the record's table by its column names."""

    model_config = ConfigDict(frozen=True, from_attributes=True)

    @field_validator("details", "partitions", mode="before", check_fields=False)
    @classmethod
    def _null_json_is_empty(cls, value: Any) -> Any:
        """A JSON column that is NULL reads as {}."""
        return {} if value is None else value


class PipelineRecord(_Record):
    name: str
    last_version: int
    created_at: float


class VersionRecord(_Record):
    pipeline: str
    version: int
    state: VersionState
    rules_version: str | None
    rules_hash: str | None
    code_ref: str | None
    table_path: str
    checkpoint_path: str
    group_id: str
    run_dir: str | None
    rejects_path: str | None
    pid: int | None
    error: str | None
    actor: str
    reason: str | None
    created_at: float
    updated_at: float
    started_at: float | None
    stopped_at: float | None
    caught_up_at: float | None
    served_at: float | None
    details: dict[str, Any] = {}
    lease_owner: str | None = None
    lease_epoch: int | None = None
    lease_expires: float | None = None

    def lease_held(self, now: float | None = None) -> bool:
        """Whether someone holds a fresh lease on this version (is starting or stopping its job)."""
        return (self.lease_owner is not None and self.lease_expires is not None
                and self.lease_expires > (time.time() if now is None else now))

    @property
    def ever_served(self) -> bool:
        return self.served_at is not None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def in_flight(self) -> bool:
        """Deployed, not yet served, and not stopped: a second deploy of the pipeline waits for it."""
        return self.state in IN_FLIGHT and self.served_at is None


class AliasRecord(_Record):
    alias: str
    pipeline: str
    version: int
    previous_version: int | None
    updated_at: float
    updated_by: str
    reason: str | None
    published_version: int | None
    published_at: float | None

    @property
    def needs_publish(self) -> bool:
        """The CAS is done but the pointer file does not (knowingly) hold this version yet."""
        return self.published_version != self.version


class AliasHistoryRecord(_Record):
    id: int
    alias: str
    pipeline: str
    from_version: int | None
    to_version: int
    actor: str
    reason: str | None
    at: float


class LagSampleRecord(_Record):
    id: int
    pipeline: str
    version: int
    at: float
    total: int | None
    partitions: dict[str, Any]
    lag_seconds: float | None = None    # schema step 4; None: unknown
    batches: int | None = None          # schema step 5: committed by the job since it started; None: unknown


class AuditRecord(_Record):
    id: int
    at: float
    actor: str
    action: str
    pipeline: str | None
    version: int | None
    reason: str | None
    outcome: str
    details: dict[str, Any]
