"""store: SQLAlchemy 2 tables, repositories and Alembic migrations; SQLite (WAL) under
CORRAL_HOME by default, PostgreSQL through CORRAL_DB_URL."""
