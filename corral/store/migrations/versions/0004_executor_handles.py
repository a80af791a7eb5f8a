"""executor contract v2: replicas keep an opaque executor handle, the infra they run on, an
attempt counter (one key per attempt) and their bound ports, instead of a pid

Revision ID: 0004
Revises: 0003
"""
from alembic import op
import sqlalchemy as sa

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.add_column(sa.Column("infra", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("handle", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("ports", sa.JSON(), nullable=True))
    # A replica running under the old contract keeps its process: its pid becomes a local handle.
    op.execute("UPDATE replicas SET infra = 'local', attempt = restarts + 1 WHERE pid IS NOT NULL")
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, job_id, task, rank, restarts, pid, pid_started_at FROM replicas "
                                "WHERE pid IS NOT NULL")).fetchall()
    handles = sa.table("replicas", sa.column("id", sa.Integer), sa.column("handle", sa.JSON))
    for r in rows:
        key = f"{r.job_id}.{r.task}.{r.rank}.r{r.restarts}"
        conn.execute(handles.update().where(handles.c.id == r.id),
                     {"handle": {"pid": r.pid, "started_at": r.pid_started_at or 0.0, "key": key}})
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.drop_column("pid")
        batch_op.drop_column("pid_started_at")


def downgrade() -> None:
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("pid_started_at", sa.Float(), nullable=True))
        batch_op.drop_column("ports")
        batch_op.drop_column("attempt")
        batch_op.drop_column("handle")
        batch_op.drop_column("infra")
