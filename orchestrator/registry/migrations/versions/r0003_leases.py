"""Step 3: job-start leases on versions (owner, epoch, expiry)."""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from orchestrator.registry.schema import apply_step

    apply_step(op.get_bind(), 3)


def downgrade() -> None:
    raise NotImplementedError("kappa's registry migrations go forward only; restore a backup to go back")
