"""Step 5: micro-batches committed since the job started, on lag samples."""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from orchestrator.registry.schema import apply_step

    apply_step(op.get_bind(), 5)


def downgrade() -> None:
    raise NotImplementedError("kappa's registry migrations go forward only; restore a backup to go back")
