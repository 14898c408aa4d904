"""Step 4: lag in seconds on lag samples."""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from orchestrator.registry.schema import apply_step

    apply_step(op.get_bind(), 4)


def downgrade() -> None:
    raise NotImplementedError("kappa's registry migrations go forward only; restore a backup to go back")
