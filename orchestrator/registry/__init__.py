"""The registry: the durable record of pipelines, versions, aliases, lag samples and the audit log.

SQLAlchemy Core on SQLite (the embedded default, one file) or PostgreSQL (anything shared).
`schema` holds the tables and the numbered migrations, `records` what queries return, `engine`
the connections and transactions, `store` the `Registry` with all its queries and changes. Times are
unix seconds (float, UTC); version states are `orchestrator.core.states.VersionState`.
"""

from orchestrator.registry.records import (AliasHistoryRecord, AliasRecord, AuditRecord, LagSampleRecord,
                                           PipelineRecord, VersionRecord)
from orchestrator.registry.schema import HEAD, MIGRATIONS, Migration, metadata
from orchestrator.registry.store import SET_STATE_FIELDS, Registry

__all__ = ["HEAD", "MIGRATIONS", "SET_STATE_FIELDS", "AliasHistoryRecord", "AliasRecord", "AuditRecord",
           "LagSampleRecord", "Migration", "PipelineRecord", "Registry", "VersionRecord", "metadata"]
