"""hold and requeue: a pending job may be held (by its user or by an operator) and released;
a running job's requeue is asked for durably, so a server restart mid-stop still requeues it;
a task's service endpoint keeps its port across server restarts

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("hold", sa.String(length=8), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("requeue_requested_at", sa.Float(), nullable=True))
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("endpoint_port", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("endpoint_port")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("requeue_requested_at")
        batch_op.drop_column("hold")
