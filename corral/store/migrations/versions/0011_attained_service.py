"""attained service: the GPU-seconds a job held in its earlier attempts (least attained
service, ``scheduler.las``), kept so a server restart does not give a requeued job a fresh
start in the top queue

Revision ID: 0011
Revises: 0010
"""
from alembic import op
import sqlalchemy as sa

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("attained_gpu_s", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("attained_gpu_s")
