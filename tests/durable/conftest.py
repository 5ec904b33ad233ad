"""Both durable stores behind one fixture: ``backend`` runs each test on SQLite and Postgres.

SQLite gets a fresh file per test; Postgres a fresh schema (``prefect_coder_test_<hex>``)
that is dropped afterwards. Postgres is found at ``PREFECT_CODER_TEST_POSTGRES_DSN``
(default ``postgresql://postgres@127.0.0.1:5432/test``). When it cannot be reached the
Postgres tests are skipped with a note on how to run them, unless
``PREFECT_CODER_REQUIRE_POSTGRES=1`` (CI sets it): then they fail.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from uuid import uuid4

import asyncpg
import pytest

from coder_chat.durable.postgres import PostgresStore, redact_dsn
from coder_chat.durable.records import Fence, StepRecord
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.store import DurableStore

ROOT = Path(__file__).resolve().parents[2]
DSN_ENV = "PREFECT_CODER_TEST_POSTGRES_DSN"
REQUIRE_ENV = "PREFECT_CODER_REQUIRE_POSTGRES"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
#: The child's environment variable carrying the DSN (never on its command line).
WORKER_DSN_ENV = "PREFECT_CODER_WORKER_DSN"

Kind = Literal["sqlite", "postgres"]


def step_record(fence: Fence, step: int, **extra: Any) -> StepRecord:
    """A finished step of ``fence``'s workflow: chat ``chat-1``, cursor ``10 + step``."""
    fields: dict[str, Any] = {
        "tenant": fence.tenant,
        "workflow_id": fence.workflow_id,
        "step": step,
        "chat_id": "chat-1",
        "last_seen_message_id": 10 + step,
        "text": f"answer {step}",
        "verdict": "ran",
    }
    return StepRecord.model_validate({**fields, **extra})


def postgres_dsn_from_env() -> str:
    return os.environ.get(DSN_ENV) or DEFAULT_DSN


def _probe(dsn: str) -> str | None:
    """Why Postgres at ``dsn`` cannot be used, or None when it can."""

    async def attempt() -> None:
        conn = await asyncpg.connect(dsn, timeout=5)
        try:
            await conn.execute("SELECT 1")
        finally:
            await conn.close()

    with ThreadPoolExecutor(max_workers=1) as pool:  # its own loop, whatever runs here
        try:
            pool.submit(asyncio.run, attempt()).result()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
    return None


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    dsn = postgres_dsn_from_env()
    problem = _probe(dsn)
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


@dataclass
class Backend:
    """One store's location: a SQLite file or a Postgres schema; opens store instances."""

    kind: Kind
    #: The SQLite file, or the Postgres schema.
    location: str
    dsn: str = ""
    stores: list[DurableStore] = field(default_factory=list)
    siblings: list[Backend] = field(default_factory=list)

    @property
    def is_postgres(self) -> bool:
        return self.kind == "postgres"

    def open(self, **postgres_options: Any) -> DurableStore:
        """Another store instance on the same data (its own connection or pool)."""
        store: DurableStore
        if self.is_postgres:
            store = PostgresStore(self.dsn, schema=self.location, **postgres_options)
        else:
            store = SqliteStore(self.location)
        self.stores.append(store)
        return store

    def sibling(self, tag: str) -> Backend:
        """Another, fresh location of the same kind (cleaned up with this one)."""
        location = f"{self.location}_{tag}" if self.is_postgres else f"{self.location}.{tag}"
        other = Backend(self.kind, location, self.dsn)
        self.siblings.append(other)
        return other

    def worker(self, *args: str) -> subprocess.Popen[str]:
        """``python -m tests.durable._worker`` on this store, pipes on stdin and stdout."""
        return subprocess.Popen(
            [sys.executable, "-m", "tests.durable._worker", self.kind, self.location, *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, WORKER_DSN_ENV: self.dsn},
        )

    async def execute(self, sqlite_sql: str, postgres_sql: str, *args: Any) -> None:
        """Write to the store's tables behind its back; ``{s}`` is the Postgres schema."""
        if self.is_postgres:
            pg = await asyncpg.connect(self.dsn)
            try:
                await pg.execute(postgres_sql.format(s=f'"{self.location}"'), *args)
            finally:
                await pg.close()
        else:
            with closing(sqlite3.connect(self.location)) as db:
                db.execute(sqlite_sql, args)
                db.commit()

    async def aclose(self) -> None:
        for sibling in self.siblings:
            await sibling.aclose()
        for store in self.stores:
            await store.close()
        if self.is_postgres:
            conn = await asyncpg.connect(self.dsn)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{self.location}" CASCADE')
            finally:
                await conn.close()


def make_backend(kind: Kind, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if kind == "postgres":
        dsn = request.getfixturevalue("postgres_dsn")
        return Backend("postgres", f"prefect_coder_test_{uuid4().hex}", dsn)
    return Backend("sqlite", str(tmp_path / "store.db"))


@pytest.fixture(params=["sqlite", "postgres"])
def backend_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, request, tmp_path)


@pytest.fixture
async def backend(backend_spec: Backend) -> AsyncIterator[Backend]:
    try:
        yield backend_spec
    finally:
        await backend_spec.aclose()


@pytest.fixture
async def store(backend: Backend) -> DurableStore:
    return backend.open()


@pytest.fixture
def pg_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend("postgres", request, tmp_path)


@pytest.fixture
async def pg(pg_spec: Backend) -> AsyncIterator[Backend]:
    """A Postgres-only backend (a fresh schema)."""
    try:
        yield pg_spec
    finally:
        await pg_spec.aclose()
