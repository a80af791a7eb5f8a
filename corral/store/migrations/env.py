"""Alembic environment: runs on the connection corral hands in (see database.migrate)."""

from alembic import context

from corral.store.tables import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
