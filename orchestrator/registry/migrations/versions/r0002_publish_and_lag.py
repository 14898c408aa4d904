"""Step 2: publish tracking, served_at, rejects path, version details, lag samples."""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from orchestrator.registry.schema import apply_step

    apply_step(op.get_bind(), 2)


def downgrade() -> None:
    raise NotImplementedError("kappa's registry migrations go forward only; restore a backup to go back")
