"""replica service state: address, readiness, restart deadline

Revision ID: 0002
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.add_column(sa.Column("addr", sa.String(length=45), nullable=True))
        batch_op.add_column(sa.Column("ready", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column("restart_at", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("last_exit_code", sa.Integer(), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_user_name", ["user", "name"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_user_name")
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.drop_column("last_exit_code")
        batch_op.drop_column("restart_at")
        batch_op.drop_column("ready")
        batch_op.drop_column("addr")
