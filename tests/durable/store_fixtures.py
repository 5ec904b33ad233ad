"""Both durable stores behind one fixture: ``backend`` runs each test on SQLite and Postgres.
A conftest imports these fixtures to offer them (``tests/durable``, ``tests/workflows``).

SQLite gets a fresh file per test; Postgres a fresh schema (``prefect_coder_test_<hex>``)
that is dropped afterwards. Postgres is found at ``PREFECT_CODER_TEST_POSTGRES_DSN``
(default ``postgresql://postgres@127.0.0.1:5432/test``). When it cannot be reached the
Postgres tests are skipped with a note on how to run them, unless
``PREFECT_CODER_REQUIRE_POSTGRES=1`` (CI sets it): then they fail.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path

import pytest

from coder_chat.durable.postgres import redact_dsn
from coder_chat.durable.store import DurableStore

from .backends import DSN_ENV, REQUIRE_ENV, Backend, make_backend, postgres_dsn_from_env, probe


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    dsn = postgres_dsn_from_env()
    problem = probe(dsn)
    if problem is None:
        return dsn
    message = (
        f"PostgreSQL is not reachable at {redact_dsn(dsn)} ({problem}). To run the Postgres "
        f"store tests, start PostgreSQL on 127.0.0.1:5432 (user postgres, database test) or "
        f"set {DSN_ENV} to a DSN of a server where this user may create schemas."
    )
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message} {REQUIRE_ENV}=1, so a missing server is a failure.")
    pytest.skip(message)


@pytest.fixture(params=["sqlite", "postgres"])
def backend_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, request, tmp_path)


@pytest.fixture
async def backend(backend_spec: Backend) -> AsyncIterator[Backend]:
    async with aclosing(backend_spec):
        yield backend_spec


@pytest.fixture
async def store(backend: Backend) -> DurableStore:
    return backend.open()


@pytest.fixture
def pg_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend("postgres", request, tmp_path)


@pytest.fixture
async def pg(pg_spec: Backend) -> AsyncIterator[Backend]:
    """A Postgres-only backend (a fresh schema)."""
    async with aclosing(pg_spec):
        yield pg_spec
