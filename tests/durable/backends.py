"""The durable stores' tests' locations: a SQLite file or a Postgres schema (:class:`Backend`),
and the records and settings those tests share. The fixtures are in ``conftest.py``."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from uuid import uuid4

import asyncpg
import pytest

from coder_chat.durable.postgres import PostgresStore
from coder_chat.durable.records import Fence, JournalEntry, StepRecord, WorkflowState
from coder_chat.durable.sqlite import APPLICATION_ID, SqliteStore
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


def probe(dsn: str) -> str | None:
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


T = "org-1"


def journal(state: str = "submitting", attempt: int = 1, **extra: Any) -> JournalEntry:
    return JournalEntry.model_validate(
        {"state": state, "marker": f"step-{attempt}", "attempt": attempt, **extra}
    )


FencedWrite = Callable[[DurableStore, Fence], Awaitable[object]]


FENCED_WRITES: dict[str, FencedWrite] = {
    "save_checkpoint": lambda s, f: s.save_checkpoint(f, "chat-late", 99),
    "clear_checkpoint": lambda s, f: s.clear_checkpoint(f),
    "heartbeat": lambda s, f: s.heartbeat(f),
    "finish": lambda s, f: s.finish(f, WorkflowState.FINISHED),
    "write_journal": lambda s, f: s.write_journal(f, "chat-1", journal("resumed", 9)),
    "mark_discarded": lambda s, f: s.mark_discarded(f, "chat-1"),
    "claim_tool": lambda s, f: s.claim_tool(f, "chat-1", "call-late", tool_name="t"),
    "complete_tool": lambda s, f: s.complete_tool(f, "chat-1", "call-1", output="late"),
    "complete_step": lambda s, f: s.complete_step(f, step_record(f, 1, chat_id="chat-late")),
}


async def snapshot(store: DurableStore, tenant: str = T) -> list[object]:
    return [
        await store.list_workflows(tenant),
        await store.list_chats(tenant),
        await store.list_tools(tenant, "chat-1"),
        await store.list_steps(tenant, "wf"),
    ]


async def installed_versions(backend: Backend) -> list[int]:
    """The schema versions the store's database says are installed (an SQLite file keeps
    only the highest, and must carry the store's application id)."""
    if backend.is_postgres:
        conn = await asyncpg.connect(backend.dsn)
        try:
            rows = await conn.fetch(
                f'SELECT version FROM "{backend.location}".migrations ORDER BY version'
            )
        finally:
            await conn.close()
        return [int(r["version"]) for r in rows]
    with closing(sqlite3.connect(backend.location)) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    return list(range(1, version + 1))


async def insert_malformed_workflow(backend: Backend, tenant: str) -> None:
    """A workflow row ``bad`` whose body is not a workflow record (its tenant a number)."""
    await backend.execute(
        "INSERT INTO workflows (tenant, workflow_id, epoch, state, deployment, heartbeat_at, body) "
        "VALUES (?, 'bad', 1, 'running', 'local', NULL, ?)",
        "INSERT INTO {s}.workflows (tenant, workflow_id, epoch, state, deployment, heartbeat_at, "
        "body) VALUES ($1, 'bad', 1, 'running', 'local', NULL, $2::jsonb)",
        tenant,
        '{"tenant": 5, "workflow_id": "bad"}',
    )
