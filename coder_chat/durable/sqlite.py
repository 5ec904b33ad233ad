"""``SqliteStore``: the embedded default store, one file, safe across processes.

The file is opened in WAL mode with ``synchronous=FULL``; every write runs in
its own ``BEGIN IMMEDIATE`` transaction and is committed before the call
returns, so a process killed right after a write leaves it on disk. All SQLite
work happens on one dedicated thread per store, so the event loop never blocks
and the store works from any event loop (Prefect runs tasks on several).

A file that is not a SQLite database, or a database some other program owns,
is refused and left untouched; so is one written by a newer version of us.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import CoderStoreError
from .records import (
    ChatRecord,
    Fence,
    JournalEntry,
    LedgerEntry,
    WorkflowRecord,
    WorkflowState,
    utcnow,
)
from .store import SCHEMA_VERSION, FencedOut

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

#: ``PRAGMA application_id`` of our files ("PCOD"), to tell them from foreign ones.
APPLICATION_ID = 0x50434F44
BUSY_TIMEOUT_MS = 30_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS workflows (
    tenant TEXT NOT NULL, workflow_id TEXT NOT NULL, epoch INTEGER NOT NULL,
    state TEXT NOT NULL, deployment TEXT NOT NULL, heartbeat_at TEXT,
    body TEXT NOT NULL, PRIMARY KEY (tenant, workflow_id));
CREATE INDEX IF NOT EXISTS workflows_by_deployment ON workflows (tenant, deployment, state);
CREATE TABLE IF NOT EXISTS chats (
    tenant TEXT NOT NULL, chat_id TEXT NOT NULL, workflow_id TEXT NOT NULL,
    discarded INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (tenant, chat_id));
CREATE TABLE IF NOT EXISTS ledger (
    tenant TEXT NOT NULL, chat_id TEXT NOT NULL, tool_call_id TEXT NOT NULL,
    state TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (tenant, chat_id, tool_call_id));
"""


class SqliteStore:
    """The durable store in one SQLite file. Create it, use it, ``await close()``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="prefect-coder-sqlite"
        )
        self._local = threading.local()
        self._ready = False
        self._closed = False

    def __repr__(self) -> str:
        return f"SqliteStore(path={str(self.path)!r})"

    # -- plumbing -------------------------------------------------------------------
    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise CoderStoreError(f"{self!r} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call, fn)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._connection()
        try:
            return fn(conn)
        except sqlite3.OperationalError as exc:
            if conn.in_transaction:
                conn.rollback()
            retryable = "locked" in str(exc) or "busy" in str(exc)
            raise CoderStoreError(f"SQLite store {self.path}: {exc}", retryable=retryable) from exc
        except sqlite3.DatabaseError as exc:
            if conn.in_transaction:
                conn.rollback()
            raise CoderStoreError(f"SQLite store {self.path}: {exc}") from exc
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._open()
            self._local.conn = conn
        return conn

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        existed = self.path.exists() and self.path.stat().st_size > 0
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            _check_ownership(conn, self.path, existed)
            _enable_wal(conn)
            conn.execute("PRAGMA synchronous = FULL")
            _migrate(conn)
        except BaseException as exc:
            if conn is not None:  # a refused file keeps no open handle
                conn.close()
            if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                raise CoderStoreError(f"SQLite store {self.path}: {exc}", retryable=True) from None
            if isinstance(exc, sqlite3.DatabaseError):
                raise CoderStoreError(
                    f"{self.path} is not a usable SQLite database ({exc}); it was left untouched"
                ) from None
            raise
        return conn

    @staticmethod
    def _write(conn: sqlite3.Connection, fn: Callable[[], T]) -> T:
        conn.execute("BEGIN IMMEDIATE")
        result = fn()
        conn.execute("COMMIT")
        return result

    # -- workflows --------------------------------------------------------------------
    async def begin_run(
        self,
        tenant: str,
        workflow_id: str,
        *,
        deployment: str = "local",
        flow_run_id: str | None = None,
    ) -> Fence:
        def op(conn: sqlite3.Connection) -> Fence:
            def write() -> Fence:
                current = _workflow(conn, tenant, workflow_id)
                now = utcnow()
                base = current or WorkflowRecord(tenant=tenant, workflow_id=workflow_id)
                record = base.model_copy(
                    update={
                        "epoch": base.epoch + 1,
                        "state": WorkflowState.RUNNING,
                        "deployment": deployment,
                        "flow_run_id": flow_run_id,
                        "heartbeat_at": now,
                        "updated_at": now,
                    }
                )
                _put_workflow(conn, record)
                return Fence(tenant=tenant, workflow_id=workflow_id, epoch=record.epoch)

            return self._write(conn, write)

        return await self._run(op)

    async def get_workflow(self, tenant: str, workflow_id: str) -> WorkflowRecord | None:
        return await self._run(lambda conn: _workflow(conn, tenant, workflow_id))

    async def _update_workflow(self, fence: Fence, changes: dict[str, Any]) -> None:
        def op(conn: sqlite3.Connection) -> None:
            def write() -> None:
                current = _fenced(conn, fence)
                _put_workflow(conn, current.model_copy(update={**changes, "updated_at": utcnow()}))

            self._write(conn, write)

        await self._run(op)

    async def save_checkpoint(
        self, fence: Fence, chat_id: str, last_seen_message_id: int | None
    ) -> None:
        await self._update_workflow(
            fence, {"chat_id": chat_id, "last_seen_message_id": last_seen_message_id}
        )

    async def clear_checkpoint(self, fence: Fence) -> None:
        await self._update_workflow(fence, {"chat_id": None, "last_seen_message_id": None})

    async def heartbeat(self, fence: Fence) -> None:
        await self._update_workflow(fence, {"heartbeat_at": utcnow()})

    async def finish(self, fence: Fence, state: WorkflowState) -> None:
        await self._update_workflow(fence, {"state": state})

    async def list_workflows(
        self,
        tenant: str,
        *,
        deployment: str | None = None,
        states: Sequence[WorkflowState] | None = None,
        stale_before: datetime | None = None,
    ) -> list[WorkflowRecord]:
        sql, args = "SELECT body FROM workflows WHERE tenant = ?", [tenant]
        if deployment is not None:
            sql, args = sql + " AND deployment = ?", [*args, deployment]
        if states:
            sql += f" AND state IN ({','.join('?' * len(states))})"
            args += [str(s) for s in states]
        if stale_before is not None:
            sql, args = sql + " AND heartbeat_at < ?", [*args, _stamp(stale_before)]
        sql += " ORDER BY workflow_id"
        rows = await self._run(lambda conn: conn.execute(sql, args).fetchall())
        return [_parse(WorkflowRecord, row[0], "workflows") for row in rows]

    # -- chats --------------------------------------------------------------------------
    async def get_chat(self, tenant: str, chat_id: str) -> ChatRecord | None:
        return await self._run(lambda conn: _chat(conn, tenant, chat_id))

    async def _update_chat(self, fence: Fence, chat_id: str, changes: dict[str, Any]) -> None:
        def op(conn: sqlite3.Connection) -> None:
            def write() -> None:
                _fenced(conn, fence)
                current = _chat(conn, fence.tenant, chat_id) or ChatRecord(
                    tenant=fence.tenant, chat_id=chat_id, workflow_id=fence.workflow_id
                )
                record = current.model_copy(update={**changes, "updated_at": utcnow()})
                conn.execute(
                    "INSERT OR REPLACE INTO chats (tenant, chat_id, workflow_id, discarded, body) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (
                        record.tenant,
                        record.chat_id,
                        record.workflow_id,
                        int(record.discarded),
                        record.model_dump_json(),
                    ),
                )

            self._write(conn, write)

        await self._run(op)

    async def write_journal(self, fence: Fence, chat_id: str, entry: JournalEntry) -> None:
        await self._update_chat(fence, chat_id, {"journal": entry})

    async def mark_discarded(self, fence: Fence, chat_id: str) -> None:
        await self._update_chat(fence, chat_id, {"discarded": True})

    async def list_chats(self, tenant: str, *, discarded: bool | None = None) -> list[ChatRecord]:
        sql, args = "SELECT body FROM chats WHERE tenant = ?", [tenant]
        args_list: list[str | int] = list(args)
        if discarded is not None:
            sql, args_list = sql + " AND discarded = ?", [*args_list, int(discarded)]
        rows = await self._run(
            lambda conn: conn.execute(sql + " ORDER BY chat_id", args_list).fetchall()
        )
        return [_parse(ChatRecord, row[0], "chats") for row in rows]

    # -- ledger ---------------------------------------------------------------------------
    async def claim_tool(
        self,
        fence: Fence,
        chat_id: str,
        tool_call_id: str,
        *,
        tool_name: str,
        marker: str = "",
        args_digest: str = "",
    ) -> tuple[bool, LedgerEntry]:
        entry = LedgerEntry(
            tenant=fence.tenant,
            chat_id=chat_id,
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            marker=marker,
            args_digest=args_digest,
        )

        def op(conn: sqlite3.Connection) -> tuple[bool, LedgerEntry]:
            def write() -> tuple[bool, LedgerEntry]:
                _fenced(conn, fence)
                cursor = conn.execute(
                    "INSERT INTO ledger (tenant, chat_id, tool_call_id, state, body) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (tenant, chat_id, tool_call_id) DO NOTHING",
                    (entry.tenant, chat_id, tool_call_id, entry.state, entry.model_dump_json()),
                )
                if cursor.rowcount == 1:
                    return True, entry
                existing = _ledger(conn, fence.tenant, chat_id, tool_call_id)
                assert existing is not None
                return False, existing

            return self._write(conn, write)

        return await self._run(op)

    async def complete_tool(
        self, fence: Fence, chat_id: str, tool_call_id: str, *, output: Any, is_error: bool = False
    ) -> LedgerEntry:
        def op(conn: sqlite3.Connection) -> LedgerEntry:
            def write() -> LedgerEntry:
                _fenced(conn, fence)
                current = _ledger(conn, fence.tenant, chat_id, tool_call_id)
                if current is None:
                    raise CoderStoreError(
                        f"no ledger entry for tool call {tool_call_id} of chat {chat_id}"
                    )
                done = current.model_copy(
                    update={
                        "state": "done",
                        "output": output,
                        "is_error": is_error,
                        "updated_at": utcnow(),
                    }
                )
                conn.execute(
                    "UPDATE ledger SET state = ?, body = ? WHERE tenant = ? AND chat_id = ? AND tool_call_id = ?",
                    ("done", done.model_dump_json(), fence.tenant, chat_id, tool_call_id),
                )
                return done

            return self._write(conn, write)

        return await self._run(op)

    async def get_tool(self, tenant: str, chat_id: str, tool_call_id: str) -> LedgerEntry | None:
        return await self._run(lambda conn: _ledger(conn, tenant, chat_id, tool_call_id))

    async def list_tools(self, tenant: str, chat_id: str) -> list[LedgerEntry]:
        sql = "SELECT body FROM ledger WHERE tenant = ? AND chat_id = ? ORDER BY rowid"
        rows = await self._run(lambda conn: conn.execute(sql, (tenant, chat_id)).fetchall())
        return [_parse(LedgerEntry, row[0], "ledger") for row in rows]

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def shut(_: sqlite3.Connection | None = None) -> None:
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                conn.close()
                self._local.conn = None

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, shut)
        self._executor.shutdown(wait=True)


# -- helpers (run on the store's thread) ---------------------------------------------------


def _check_ownership(conn: sqlite3.Connection, path: Path, existed: bool) -> None:
    # One read transaction, one snapshot: another process may be creating the store
    # right now, and tables without our application_id would look foreign.
    conn.execute("BEGIN")
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    if app_id == APPLICATION_ID:
        if version > SCHEMA_VERSION:
            raise CoderStoreError(
                f"{path} holds schema version {version}, newer than this prefect-coder "
                f"understands ({SCHEMA_VERSION}); upgrade prefect-coder to use it"
            )
        return
    if existed and (app_id != 0 or tables > 0):
        raise CoderStoreError(
            f"{path} belongs to another program (not a prefect-coder store); it was left untouched"
        )


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


def _enable_wal(conn: sqlite3.Connection) -> None:
    # Switching to WAL upgrades a read lock, and SQLite does not call the busy handler
    # for that: when several processes open a new file at once, wait here instead.
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.005)


def _migrate(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version >= SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    if conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:  # another process won
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.execute("COMMIT")


def _stamp(moment: datetime) -> str:
    # UTC, fixed width: heartbeat comparisons are string comparisons in SQL.
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(model: type[M], body: str, table: str) -> M:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise CoderStoreError(
            f"malformed row in {table}: {exc.error_count()} problem(s): {body[:200]!r}"
        ) from None


def _workflow(conn: sqlite3.Connection, tenant: str, workflow_id: str) -> WorkflowRecord | None:
    row = conn.execute(
        "SELECT body FROM workflows WHERE tenant = ? AND workflow_id = ?", (tenant, workflow_id)
    ).fetchone()
    return None if row is None else _parse(WorkflowRecord, row[0], "workflows")


def _put_workflow(conn: sqlite3.Connection, record: WorkflowRecord) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO workflows (tenant, workflow_id, epoch, state, deployment, heartbeat_at, body) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            record.tenant,
            record.workflow_id,
            record.epoch,
            str(record.state),
            record.deployment,
            _stamp(record.heartbeat_at) if record.heartbeat_at else None,
            record.model_dump_json(),
        ),
    )


def _fenced(conn: sqlite3.Connection, fence: Fence) -> WorkflowRecord:
    current = _workflow(conn, fence.tenant, fence.workflow_id)
    if current is None or current.epoch != fence.epoch:
        raise FencedOut(fence, current.epoch if current else None)
    return current


def _chat(conn: sqlite3.Connection, tenant: str, chat_id: str) -> ChatRecord | None:
    row = conn.execute(
        "SELECT body FROM chats WHERE tenant = ? AND chat_id = ?", (tenant, chat_id)
    ).fetchone()
    return None if row is None else _parse(ChatRecord, row[0], "chats")


def _ledger(
    conn: sqlite3.Connection, tenant: str, chat_id: str, tool_call_id: str
) -> LedgerEntry | None:
    row = conn.execute(
        "SELECT body FROM ledger WHERE tenant = ? AND chat_id = ? AND tool_call_id = ?",
        (tenant, chat_id, tool_call_id),
    ).fetchone()
    return None if row is None else _parse(LedgerEntry, row[0], "ledger")
