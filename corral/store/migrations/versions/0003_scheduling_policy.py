"""scheduling policy: job partition/account/qos/nice/priority/time limit/dependency/requeues; usage ledger

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("partition", sa.String(length=64), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("account", sa.String(length=64), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("qos", sa.String(length=64), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("nice", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("priority", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("time_limit", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("dependency", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("kill_on_invalid_dep", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column("requeues", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "usage",
        sa.Column("account", sa.String(length=64), primary_key=True),
        sa.Column("user", sa.String(length=64), primary_key=True),
        sa.Column("qos", sa.String(length=64), primary_key=True),
        sa.Column("charge", sa.Float(), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("usage")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for column in ("requeues", "kill_on_invalid_dep", "dependency", "time_limit", "priority", "nice", "qos",
                       "account", "partition"):
            batch_op.drop_column(column)
