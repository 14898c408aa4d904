"""Step 1: initial schema: pipelines, versions, aliases, alias history, audit log."""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    from orchestrator.registry.schema import apply_step

    apply_step(op.get_bind(), 1)


def downgrade() -> None:
    raise NotImplementedError("kappa's registry migrations go forward only; restore a backup to go back")
