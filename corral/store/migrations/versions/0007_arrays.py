"""job arrays: each element is a job of its own, tied to its array by the id of the array's
first element, with its index and the array's throttle (``--array=0-15%4``)

Revision ID: 0007
Revises: 0006
"""
from alembic import op
import sqlalchemy as sa

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("array_job_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("array_index", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("array_throttle", sa.Integer(), nullable=True))
        batch_op.create_index("ix_jobs_array_job_id", ["array_job_id"])


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_array_job_id")
        batch_op.drop_column("array_throttle")
        batch_op.drop_column("array_index")
        batch_op.drop_column("array_job_id")
