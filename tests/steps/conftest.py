"""Fixtures of the step tests: ``store``, an SQLite store of the test's own, and ``pg``,
a fresh schema on the PostgreSQL server the store tests use."""

from tests.durable.store_fixtures import pg, pg_spec, postgres_dsn
from tests.steps.support import sqlite_store

__all__ = ["pg", "pg_spec", "postgres_dsn", "sqlite_store"]
