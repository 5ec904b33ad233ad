"""Fixtures of the sweep tests: ``store``, an SQLite store of the test's own."""

from tests.steps.support import sqlite_store

__all__ = ["sqlite_store"]
