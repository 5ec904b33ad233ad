"""Stores written by earlier code (schema versions 1 and 2) migrate to the current one, keeping
their data.

The v1 and v2 schemas are built by the stores' own released migrations, which a test keeps
as they were shipped (a released migration is never edited). Rows are written the way that code wrote
them: JSON bodies of the records as they were then (v1: no ``archive_at_end``; v2: finished
steps without ``prompt``).
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, closing
from datetime import UTC, datetime
from typing import Literal, TypeVar

import asyncpg

from coder_chat.durable import postgres as postgres_store
from coder_chat.durable import sqlite as sqlite_store
from coder_chat.durable.records import (
    ChatRecord,
    Fence,
    JournalEntry,
    LedgerEntry,
    StepRecord,
    WorkflowRecord,
    WorkflowState,
    prompt_digest,
)
from coder_chat.durable.store import SCHEMA_VERSION, DurableStore

from .backends import Backend, installed_versions, step_record

R = TypeVar("R")

T = "org-1"
SQLITE_APPLICATION_ID = sqlite_store.APPLICATION_ID

#: What the shipped migrations wrote; a released migration is never edited (a store
#: written by it must still open), which :func:`test_released_migrations_are_never_edited`
#: holds, so these tests build the old stores from the migrations themselves.
RELEASED = {
    ("sqlite", 1): "ef5741672b960f0d",
    ("sqlite", 2): "2fc3389018bc7f80",
    ("postgres", 1): "5b64ad3f2b37ec59",
    ("postgres", 2): "7a81a44515ed1441",
}
SQLITE_V1 = sqlite_store.MIGRATIONS[1]
#: Version 1 of the Postgres store: its bookkeeping table, then its migration.
POSTGRES_V1 = f"""
CREATE SCHEMA {{s}};
CREATE TABLE {{s}}.migrations (version INTEGER PRIMARY KEY,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now());
{postgres_store.MIGRATIONS[1]}
INSERT INTO {{s}}.migrations (version) VALUES (1);
"""


def test_released_migrations_are_never_edited() -> None:
    shipped = {
        (name, version): hashlib.sha256(module.MIGRATIONS[version].encode()).hexdigest()[:16]
        for name, module in (("sqlite", sqlite_store), ("postgres", postgres_store))
        for version in (1, 2)
    }
    assert shipped == RELEASED


HEARTBEAT = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)
WORKFLOW = WorkflowRecord(
    tenant=T,
    workflow_id="wf",
    chat_id="chat-1",
    last_seen_message_id=41,
    deployment="prod",
    flow_run_id="run-3",
    epoch=3,
    heartbeat_at=HEARTBEAT,
)
CHAT = ChatRecord(
    tenant=T,
    chat_id="chat-1",
    workflow_id="wf",
    journal=JournalEntry(state="submitting", marker="step-2", attempt=1, at=HEARTBEAT),
)
#: In the order they were claimed.
TOOLS = [
    LedgerEntry(tenant=T, chat_id="chat-1", tool_call_id="call-b", tool_name="charge"),
    LedgerEntry(
        tenant=T,
        chat_id="chat-1",
        tool_call_id="call-a",
        tool_name="charge",
        state="done",
        output={"receipt": "r-1"},
    ),
]


def v1_body(record: WorkflowRecord | ChatRecord | LedgerEntry) -> str:
    if isinstance(record, WorkflowRecord):
        return record.model_dump_json(exclude={"archive_at_end"})  # a field v1 did not have
    return record.model_dump_json()


def build_sqlite_v1(path: str) -> None:
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("BEGIN")
        for statement in SQLITE_V1.split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute(f"PRAGMA application_id = {SQLITE_APPLICATION_ID}")
        db.execute("PRAGMA user_version = 1")
        db.execute(
            "INSERT INTO workflows VALUES (?, ?, ?, ?, ?, ?, ?)",
            (T, "wf", 3, "running", "prod", "2026-11-30T12:00:00.123456Z", v1_body(WORKFLOW)),
        )
        db.execute("INSERT INTO chats VALUES (?, ?, ?, 0, ?)", (T, "chat-1", "wf", v1_body(CHAT)))
        for entry in TOOLS:
            db.execute(
                "INSERT INTO ledger VALUES (?, ?, ?, ?, ?)",
                (T, "chat-1", entry.tool_call_id, entry.state, v1_body(entry)),
            )
        db.execute("COMMIT")


@asynccontextmanager
async def transaction(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to ``dsn`` in one transaction (closed after): an old store is written whole."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            yield conn
    finally:
        await conn.close()


async def build_postgres_v1(dsn: str, schema: str) -> None:
    s = f'"{schema}"'
    async with transaction(dsn) as conn:
        await conn.execute(POSTGRES_V1.format(s=s))
        await conn.execute(
            f"INSERT INTO {s}.workflows VALUES ($1, 'wf', 3, 'running', 'prod', $2, $3)",
            T,
            HEARTBEAT,
            v1_body(WORKFLOW),
        )
        await conn.execute(
            f"INSERT INTO {s}.chats VALUES ($1, 'chat-1', 'wf', false, $2)", T, v1_body(CHAT)
        )
        for entry in TOOLS:
            await conn.execute(
                f"INSERT INTO {s}.ledger (tenant, chat_id, tool_call_id, state, body) "
                "VALUES ($1, 'chat-1', $2, $3, $4)",
                T,
                entry.tool_call_id,
                entry.state,
                v1_body(entry),
            )


async def opened_at_once(
    backend: Backend, count: int, read: Callable[[DurableStore], Awaitable[R]]
) -> tuple[list[DurableStore], list[R]]:
    """``count`` stores opened at once on an old store, each reading with ``read``: the
    migration runs once, to the latest version. The stores, and what each read."""
    stores = [backend.open() for _ in range(count)]
    found = await asyncio.gather(*(read(s) for s in stores))
    assert (
        await installed_versions(backend)
        == list(range(1, SCHEMA_VERSION + 1))
        == [1, 2, 3, 4, 5, 6]
    )
    return stores, found


async def test_a_version_1_store_migrates_keeping_its_data(backend: Backend) -> None:
    await build_old_store(backend, 1)

    # Several openers at once: the migration runs once, and they all see one store id.
    stores, workflows = await opened_at_once(backend, 4, lambda s: s.get_workflow(T, "wf"))
    assert workflows == [WORKFLOW] * 4  # v1's body reads with archive_at_end's default
    assert workflows[0] is not None and workflows[0].archive_at_end is True
    ids = await asyncio.gather(*(s.store_id() for s in stores))
    assert len(set(ids)) == 1 and len(ids[0]) == 32

    store = stores[0]
    assert await store.get_chat(T, "chat-1") == CHAT
    assert await store.list_tools(T, "chat-1") == TOOLS
    assert await store.list_workflows(T, deployment="prod", states=[WorkflowState.RUNNING]) == [
        WORKFLOW
    ]
    assert await store.list_workflows(T, stale_before=HEARTBEAT) == []

    # The run that held epoch 3 under v1 still holds it, and may finish a step.
    fence = Fence(tenant=T, workflow_id="wf", epoch=3)
    await store.complete_step(fence, step_record(fence, 2, last_seen_message_id=43))
    assert [s.step for s in await store.list_steps(T, "wf")] == [2]
    won, entry = await store.claim_tool(fence, "chat-1", "call-a", tool_name="charge")
    assert (won, entry) == (False, TOOLS[1])
    assert (await store.begin_run(T, "wf", archive_at_end=False)).epoch == 4
    record = await store.get_workflow(T, "wf")
    assert record is not None
    assert (record.chat_id, record.last_seen_message_id, record.archive_at_end) == (
        "chat-1",
        43,
        False,
    )


# -- version 2: finished steps without their prompt ----------------------------------------

SQLITE_V2 = sqlite_store.MIGRATIONS[2]
POSTGRES_V2 = f"""
{postgres_store.MIGRATIONS[2]}
INSERT INTO {{s}}.migrations (version) VALUES (2);
"""

V2_STORE_ID = "0123456789ab4def8123456789abcdef"
V2_STEPS = [
    StepRecord(
        tenant=T,
        workflow_id="wf",
        step=step,
        chat_id="chat-1",
        last_seen_message_id=40 + step,
        text=f"answer {step}",
        verdict="ran",
        prompt_digest=prompt_digest(f"prompt {step}"),
        finished_at=HEARTBEAT,
    )
    for step in (1, 2)
]


def v2_step_body(record: StepRecord) -> str:
    return record.model_dump_json(exclude={"prompt"})  # a field v2 did not have


def build_sqlite_v2(path: str) -> None:
    build_sqlite_v1(path)
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("BEGIN")
        for statement in SQLITE_V2.split(";"):
            if statement.strip():
                db.execute(statement, {"store_id": V2_STORE_ID})
        for step in V2_STEPS:
            db.execute(
                "INSERT INTO steps VALUES (?, 'wf', ?, 'chat-1', ?)",
                (T, step.step, v2_step_body(step)),
            )
        db.execute("PRAGMA user_version = 2")
        db.execute("COMMIT")


async def build_postgres_v2(dsn: str, schema: str) -> None:
    await build_postgres_v1(dsn, schema)
    s = f'"{schema}"'
    async with transaction(dsn) as conn:
        await conn.execute(POSTGRES_V2.format(s=s))
        # Version 2 makes its store id itself; the test's old store has a known one.
        await conn.execute(f"UPDATE {s}.meta SET value = $1 WHERE key = 'store_id'", V2_STORE_ID)
        for step in V2_STEPS:
            await conn.execute(
                f"INSERT INTO {s}.steps VALUES ($1, 'wf', $2, 'chat-1', $3)",
                T,
                step.step,
                v2_step_body(step),
            )


async def build_old_store(backend: Backend, version: Literal[1, 2]) -> None:
    """A store as ``version`` left it, at ``backend``'s location."""
    if backend.is_postgres:
        build = {1: build_postgres_v1, 2: build_postgres_v2}[version]
        await build(backend.dsn, backend.location)
    else:
        {1: build_sqlite_v1, 2: build_sqlite_v2}[version](backend.location)
    assert await installed_versions(backend) == list(range(1, version + 1))


async def test_a_version_2_store_migrates_keeping_its_steps(backend: Backend) -> None:
    await build_old_store(backend, 2)

    stores, steps = await opened_at_once(backend, 3, lambda s: s.list_steps(T, "wf"))
    assert steps == [V2_STEPS] * 3  # v2's bodies read back, each with prompt ""
    assert all(step.prompt == "" for step in steps[0])

    store = stores[0]
    assert await store.store_id() == V2_STORE_ID
    assert await store.get_workflow(T, "wf") == WORKFLOW
    assert await store.get_chat(T, "chat-1") == CHAT
    assert await store.list_tools(T, "chat-1") == TOOLS

    # The run that held epoch 3 under v2 still holds it; a step it finishes keeps its prompt.
    fence = Fence(tenant=T, workflow_id="wf", epoch=3)
    third = V2_STEPS[0].model_copy(
        update={"step": 3, "prompt": "prompt 3", "prompt_digest": prompt_digest("prompt 3")}
    )
    await store.complete_step(fence, third)
    assert await backend.open().get_step(T, "wf", 3) == third
    assert [s.prompt for s in await store.list_steps(T, "wf")] == ["", "", "prompt 3"]
