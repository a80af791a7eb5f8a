"""domains: the domain of a job's replica names when it is not the job's name (a second
active job of one user and name is accepted, its replicas named ``{task}-{rank}.{name}-{id}``)

Revision ID: 0012
Revises: 0011
"""
from alembic import op
import sqlalchemy as sa

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("domain", sa.String(96), nullable=True))
        batch.create_index("ix_jobs_domain", ["domain"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_domain")
        batch.drop_column("domain")
