"""the server claim's epoch: a server that takes a database's claim raises it, and every
write of its control loop checks it in the same transaction, so a server that lost its
claim (its connection was cut, another server took over) never writes again

Revision ID: 0008
Revises: 0007
"""
from alembic import op
import sqlalchemy as sa

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "server_claim",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(256), nullable=False),
        sa.Column("taken_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("server_claim")
