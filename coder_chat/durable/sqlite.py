"""``SqliteStore``: the embedded default store, one file, safe across processes.

The file is opened in WAL mode; every write runs inside a ``BEGIN IMMEDIATE``
transaction and is committed before the call returns, so a process killed right
after a write leaves it on disk. Writes queued at once (many workflows in one
process) commit together, each in a savepoint of one transaction, so that they
share one flush; a write that fails is undone alone. Writes are flushed
(``synchronous=FULL``, an fsync of the log per commit) except those in
:data:`~.base.UNFLUSHED`, committed with ``synchronous=NORMAL``: the log is one
file written in order, so the next flushed write makes them durable too, and a
power loss can only take back the last few. All SQLite work happens on one
dedicated thread per store, so the event loop never blocks and the store works
from any event loop (Prefect runs tasks on several). Work reaches the thread on a
plain queue and its outcome comes back to the asking loop in one callback per batch:
a tenth of the cost of a thread pool's futures (each made of locks and conditions).

The domain rules live in :class:`~.base.DurableStore`; this module holds the SQL.
An operation's transaction methods are ``async def`` but never suspend, so the
store's thread runs a whole operation to its end inside one ``BEGIN IMMEDIATE``
(:func:`run_now`), without an event loop.

A file that is not a SQLite database, or a database some other program owns,
is refused and left untouched; so is one written by a newer version of us.
Older versions are migrated in place (:data:`MIGRATIONS`), once, whoever opens first.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from ..errors import CoderStoreError
from .base import (
    SWEEP_PREFIX,
    Changes,
    DurableStore,
    Op,
    PruneRule,
    WorkflowQuery,
    fence_holds,
    parse_row,
    step_view_of,
)
from .records import (
    ChatRecord,
    Fence,
    LedgerEntry,
    StepRecord,
    StepView,
    WorkflowRecord,
)
from .store import SCHEMA_VERSION

T = TypeVar("T")

#: ``PRAGMA application_id`` of our files ("PCOD"), to tell them from foreign ones.
APPLICATION_ID = 0x50434F44
BUSY_TIMEOUT_MS = 30_000
#: At most this many queued jobs are taken at once; their writes share one commit.
GROUP_MAX = 64

#: Numbered migrations, applied in one transaction; the highest is SCHEMA_VERSION and
#: ``PRAGMA user_version`` says which ones a file has. ``:store_id`` is bound to a fresh
#: uuid4 hex: made inside the migration, so every process opening the file sees one id.
MIGRATIONS: dict[int, str] = {
    1: """
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
""",
    2: """
CREATE TABLE steps (
    tenant TEXT NOT NULL, workflow_id TEXT NOT NULL, step INTEGER NOT NULL,
    chat_id TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (tenant, workflow_id, step));
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta (key, value) VALUES ('store_id', :store_id);
""",
    # No table changes: finished steps keep their prompt in their JSON body. Code from
    # version 2 would report such a body as malformed (records forbid unknown fields), so
    # the version tells it to upgrade instead; version 2 steps read back with prompt "".
    3: "",
    # No table changes either: a workflow keeps what it was told between turns (its
    # inputs) in its JSON body, which version 3 code would report as malformed.
    4: "",
    # No table changes: a workflow may be stored ``cancelled`` (a person stopped it) and
    # keeps its patch decisions in its JSON body; version 4 code would report either as
    # malformed.
    5: "",
    # No table changes: a finished step keeps what it consumed (its usage) in its JSON
    # body, which version 5 code would report as malformed.
    6: "",
}
assert max(MIGRATIONS) == SCHEMA_VERSION, "every schema version needs its migration"


class SqliteStore(DurableStore):
    """The durable store in one SQLite file. Create it, use it, ``await close()``."""

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path).expanduser()
        #: Work for the store's thread (``None`` asks it to stop), started on first use.
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._local = threading.local()

    defers_flushes = True

    def __repr__(self) -> str:
        return f"SqliteStore(path={str(self.path)!r})"

    # -- transactions, on the store's thread ----------------------------------------------
    async def _transact(self, doing: str, op: Op[T], *, write: bool, flush: bool = True) -> T:
        job = _Job(doing, op, write, flush, asyncio.get_running_loop().create_future())
        self._submit(job)
        result: T = await job.future
        return result

    def _submit(self, job: _Job) -> None:
        # Under the lock that close() takes too: nothing is queued after its stop.
        with self._thread_lock:
            if self._closed:
                raise CoderStoreError(f"{self!r} is closed")
            if self._thread is None:
                # A daemon: a store nobody closed must not keep the process from exiting
                # (SQLite rolls back a transaction cut short; nothing was acknowledged).
                self._thread = threading.Thread(
                    target=self._serve, name="prefect-coder-sqlite", daemon=True
                )
                self._thread.start()
            self._jobs.put(job)

    def _serve(self) -> None:
        """The store's thread: take every job queued now, commit its writes together
        (one transaction, one flush at most), then run its reads, and hand the outcomes
        back. So under load many writes share one commit, and alone a write commits by
        itself. A job whose caller was cancelled before it started is skipped."""
        while True:
            batch = [self._jobs.get()]
            while len(batch) < GROUP_MAX:
                try:
                    batch.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            stop = any(job is None for job in batch)
            live = [job for job in batch if job is not None and not job.future.cancelled()]
            writes = [job for job in live if job.write]
            outcomes = self._commit_group(writes) if writes else []
            outcomes += [self._read_now(job) for job in live if not job.write]
            _deliver(outcomes)
            if stop:
                self._shut()
                return

    def _read_now(self, job: _Job) -> _Outcome:
        try:
            conn = self._connection()
            return job, True, run_now(job.op(_SqliteTransaction(conn)))
        except Exception as exc:  # noqa: BLE001 - not swallowed: it is the caller's outcome
            return job, False, self._failed(job.doing, exc)

    def _commit_group(self, jobs: list[_Job]) -> list[_Outcome]:
        """Run each write inside a savepoint of one ``BEGIN IMMEDIATE``: a write that
        fails (fenced out, say) is undone alone; the group commits what the others did.
        If the transaction itself fails, every write in it fails and nothing is kept."""
        try:
            conn = self._connection()
            self._synchronous(conn, any(job.flush for job in jobs))
            conn.execute("BEGIN IMMEDIATE")
            outcomes = [_one_write(conn, job, self._failed) for job in jobs]
            conn.execute("COMMIT")
        except Exception as exc:  # noqa: BLE001 - every write of the group fails with it
            if getattr(self._local, "conn", None) is not None:
                _rollback(self._local.conn)
            return [(job, False, self._failed(job.doing, exc)) for job in jobs]
        return outcomes

    def _failed(self, doing: str, exc: BaseException) -> BaseException:
        """A SQLite error as the store reports it (busy: retryable); others as they are."""
        if not isinstance(exc, sqlite3.DatabaseError):
            return exc
        retryable = isinstance(exc, sqlite3.OperationalError) and _is_busy(exc)
        error = CoderStoreError(
            f"SQLite store {self.path}: {doing} failed: {exc}", retryable=retryable
        )
        error.__cause__ = exc
        return error

    def _synchronous(self, conn: sqlite3.Connection, flush: bool) -> None:
        """Set how the next commit reaches the disk; a pragma outside any transaction,
        no I/O, and only when it changes."""
        level = "FULL" if flush else "NORMAL"
        if getattr(self._local, "synchronous", None) != level:
            conn.execute(f"PRAGMA synchronous = {level}")
            self._local.synchronous = level

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._open()
            self._local.conn = conn
            self._local.synchronous = "FULL"
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

    async def close(self) -> None:
        with self._thread_lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._jobs.put(None)  # the last job: every one queued before it is served
        if thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, thread.join)

    def _shut(self) -> None:
        """On the store's thread, told to stop: close the file."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


@dataclass
class _Job:
    """Work for the store's thread, and the future (of the asking loop) its outcome goes to."""

    doing: str
    op: Op[Any]
    write: bool
    flush: bool
    future: asyncio.Future[Any]


#: A job's outcome: ``(job, True, result)`` or ``(job, False, exception)``.
_Outcome = tuple[_Job, bool, Any]


def _deliver(outcomes: list[_Outcome]) -> None:
    """Hand outcomes back to the loops that wait for them: one callback per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0].future.get_loop(), []).append(outcome)
    for loop, theirs in by_loop.items():
        # A loop that is closed has nobody waiting for these any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, theirs)


def _settle(outcomes: list[_Outcome]) -> None:
    """On the asking loop: resolve each future its caller still waits on."""
    for job, ok, value in outcomes:
        if job.future.done():  # cancelled meanwhile
            continue
        if ok:
            job.future.set_result(value)
        else:
            job.future.set_exception(value)


def _one_write(
    conn: sqlite3.Connection, job: _Job, failed: Callable[[str, BaseException], BaseException]
) -> _Outcome:
    """``(job, True, result)``, or ``(job, False, exception)`` with the write undone."""
    conn.execute("SAVEPOINT one_write")
    try:
        result = run_now(job.op(_SqliteTransaction(conn)))
    except Exception as exc:  # noqa: BLE001 - not swallowed: it becomes this write's outcome
        # An error that ended the whole transaction leaves no savepoint: this raises,
        # and the group fails as one.
        conn.execute("ROLLBACK TO one_write")
        conn.execute("RELEASE one_write")
        return job, False, failed(job.doing, exc)
    conn.execute("RELEASE one_write")
    return job, True, result


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends to its end, here, without an event loop.

    Every SQLite operation is one: its transaction's methods do their work at once.
    One that suspends (awaits something else) would leave the transaction open
    across threads, so it is stopped and refused.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise RuntimeError("a SQLite store operation suspended; it must only await its transaction")


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.rollback()


# -- the rows ----------------------------------------------------------------------------


class _SqliteTransaction:
    """The store's rows over one connection.

    A write runs inside ``BEGIN IMMEDIATE``, which holds the file's write lock until
    ``COMMIT``: nothing changes between a fenced write's check and its write, and no
    racing writer can commit in between, so a write reads, decides and writes in plain
    statements (each a few microseconds: the file is local).
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def _one(self, sql: str, args: Sequence[object]) -> Any:
        row = self._conn.execute(sql, args).fetchone()
        return None if row is None else row[0]

    def _bodies(self, sql: str, args: Sequence[object] | Mapping[str, object]) -> list[Any]:
        return [row[0] for row in self._conn.execute(sql, args).fetchall()]

    def _holds(self, fence: Fence) -> bool:
        # The epoch column is enough: the fence needs no parse of the workflow's body.
        epoch = self._one(
            "SELECT epoch FROM workflows WHERE tenant = ? AND workflow_id = ?",
            (fence.tenant, fence.workflow_id),
        )
        return fence_holds(fence, epoch)

    async def store_id(self) -> str | None:
        value = self._one("SELECT value FROM meta WHERE key = 'store_id'", ())
        return None if value is None else str(value)

    # -- workflows
    async def workflow(self, tenant: str, workflow_id: str) -> WorkflowRecord | None:
        body = self._one(
            "SELECT body FROM workflows WHERE tenant = ? AND workflow_id = ?", (tenant, workflow_id)
        )
        return None if body is None else parse_row(WorkflowRecord, body, "workflows")

    def _put_workflow(self, record: WorkflowRecord) -> None:
        self._conn.execute(
            "INSERT INTO workflows (tenant, workflow_id, epoch, state, deployment, heartbeat_at, "
            "body) VALUES (:tenant, :workflow_id, :epoch, :state, :deployment, :heartbeat_at, "
            ":body) ON CONFLICT (tenant, workflow_id) DO UPDATE SET epoch = excluded.epoch, "
            "state = excluded.state, deployment = excluded.deployment, "
            "heartbeat_at = excluded.heartbeat_at, body = excluded.body",
            _workflow_row(record),
        )

    async def start_run(self, new: WorkflowRecord, run: Changes) -> WorkflowRecord:
        current = await self.workflow(new.tenant, new.workflow_id)
        record = (
            new
            if current is None
            else current.model_copy(update={**run, "epoch": current.epoch + 1})
        )
        self._put_workflow(record)
        return record

    async def update_workflow(self, fence: Fence, changes: Changes) -> WorkflowRecord | None:
        current = await self.workflow(fence.tenant, fence.workflow_id)
        if current is None or not fence_holds(fence, current.epoch):
            return None
        record = current.model_copy(update=changes)
        self._put_workflow(record)
        return record

    async def workflows(self, query: WorkflowQuery) -> list[WorkflowRecord]:
        sql = "SELECT body FROM workflows WHERE tenant = ?"
        args: list[object] = [query.tenant]
        if query.deployment is not None:
            sql += " AND deployment = ?"
            args.append(query.deployment)
        if query.states:
            sql += f" AND state IN ({','.join('?' * len(query.states))})"
            args += [str(s) for s in query.states]
        if query.stale_before is not None:
            sql += " AND heartbeat_at < ?"
            args.append(_stamp(query.stale_before))
        bodies = self._bodies(sql + " ORDER BY workflow_id", args)
        return [parse_row(WorkflowRecord, body, "workflows") for body in bodies]

    # -- chats
    async def chat(self, tenant: str, chat_id: str) -> ChatRecord | None:
        body = self._one(
            "SELECT body FROM chats WHERE tenant = ? AND chat_id = ?", (tenant, chat_id)
        )
        return None if body is None else parse_row(ChatRecord, body, "chats")

    async def upsert_chat(
        self, fence: Fence, new: ChatRecord, changes: Changes
    ) -> ChatRecord | None:
        if not self._holds(fence):
            return None
        current = await self.chat(new.tenant, new.chat_id)
        record = new if current is None else current.model_copy(update=changes)
        self._conn.execute(
            "INSERT INTO chats (tenant, chat_id, workflow_id, discarded, body) "
            "VALUES (:tenant, :chat_id, :workflow_id, :discarded, :body) "
            "ON CONFLICT (tenant, chat_id) DO UPDATE SET workflow_id = excluded.workflow_id, "
            "discarded = excluded.discarded, body = excluded.body",
            _chat_row(record),
        )
        return record

    async def chats(self, tenant: str, discarded: bool | None) -> list[ChatRecord]:
        sql = "SELECT body FROM chats WHERE tenant = ?"
        args: list[object] = [tenant]
        if discarded is not None:
            sql += " AND discarded = ?"
            args.append(int(discarded))
        bodies = self._bodies(sql + " ORDER BY chat_id", args)
        return [parse_row(ChatRecord, body, "chats") for body in bodies]

    async def workflow_chats(self, tenant: str, workflow_id: str) -> list[ChatRecord]:
        bodies = self._bodies(
            "SELECT body FROM chats WHERE tenant = ? AND workflow_id = ? ORDER BY chat_id",
            (tenant, workflow_id),
        )
        return [parse_row(ChatRecord, body, "chats") for body in bodies]

    # -- pruning
    async def prunable(self, rule: PruneRule) -> list[WorkflowRecord]:
        where, args = _prune_where(rule)
        bodies = self._bodies(
            f"SELECT body FROM workflows WHERE {where} ORDER BY workflow_id", args
        )
        return [parse_row(WorkflowRecord, body, "workflows") for body in bodies]

    async def prune(self, rule: PruneRule) -> list[str]:
        # Inside BEGIN IMMEDIATE: nothing changes between these statements. Each states the
        # whole rule, so none of them can reach a running workflow's rows.
        where, args = _prune_where(rule)
        doomed = f"SELECT workflow_id FROM workflows WHERE {where}"
        ids = [str(i) for i in self._bodies(doomed + " ORDER BY workflow_id", args)]
        if not ids:
            return []
        their_chats = (
            f"SELECT chat_id FROM chats WHERE tenant = :tenant AND workflow_id IN ({doomed}) "
            f"UNION SELECT chat_id FROM steps WHERE tenant = :tenant AND workflow_id IN ({doomed}) "
            f"UNION SELECT json_extract(body, '$.chat_id') FROM workflows WHERE {where}"
        )
        self._conn.execute(
            f"DELETE FROM ledger WHERE tenant = :tenant AND chat_id IN ({their_chats})", args
        )
        for table in ("chats", "steps"):
            self._conn.execute(
                f"DELETE FROM {table} WHERE tenant = :tenant AND workflow_id IN ({doomed})", args
            )
        deleted = self._conn.execute(f"DELETE FROM workflows WHERE {where}", args).rowcount
        if deleted != len(ids):  # pragma: no cover - the write lock is held throughout
            raise CoderStoreError(f"prune found {len(ids)} workflows but deleted {deleted}")
        return ids

    # -- the ledger
    async def tool(self, tenant: str, chat_id: str, tool_call_id: str) -> LedgerEntry | None:
        body = self._one(
            "SELECT body FROM ledger WHERE tenant = ? AND chat_id = ? AND tool_call_id = ?",
            (tenant, chat_id, tool_call_id),
        )
        return None if body is None else parse_row(LedgerEntry, body, "ledger")

    async def claim_tool(
        self, fence: Fence, entry: LedgerEntry
    ) -> tuple[bool, LedgerEntry | None] | None:
        if not self._holds(fence):
            return None
        inserted = self._conn.execute(
            "INSERT INTO ledger (tenant, chat_id, tool_call_id, state, body) "
            "VALUES (:tenant, :chat_id, :tool_call_id, :state, :body) "
            "ON CONFLICT (tenant, chat_id, tool_call_id) DO NOTHING",
            _ledger_row(entry),
        )
        if inserted.rowcount == 1:
            return True, entry
        return False, await self.tool(entry.tenant, entry.chat_id, entry.tool_call_id)

    async def complete_tool(
        self, fence: Fence, chat_id: str, tool_call_id: str, changes: Changes
    ) -> LedgerEntry | None:
        if not self._holds(fence):
            return None
        current = await self.tool(fence.tenant, chat_id, tool_call_id)
        if current is None:
            return None
        done = current.model_copy(update=changes)
        self._conn.execute(
            "UPDATE ledger SET state = :state, body = :body "
            "WHERE tenant = :tenant AND chat_id = :chat_id AND tool_call_id = :tool_call_id",
            _ledger_row(done),
        )
        return done

    async def tools(self, tenant: str, chat_id: str) -> list[LedgerEntry]:
        bodies = self._bodies(
            "SELECT body FROM ledger WHERE tenant = ? AND chat_id = ? ORDER BY rowid",
            (tenant, chat_id),
        )
        return [parse_row(LedgerEntry, body, "ledger") for body in bodies]

    # -- finished steps
    async def step(self, tenant: str, workflow_id: str, step: int) -> StepRecord | None:
        body = self._one(
            "SELECT body FROM steps WHERE tenant = ? AND workflow_id = ? AND step = ?",
            (tenant, workflow_id, step),
        )
        return None if body is None else parse_row(StepRecord, body, "steps")

    async def complete_step(
        self, fence: Fence, checkpoint: Changes, record: StepRecord
    ) -> WorkflowRecord | None:
        workflow = await self.update_workflow(fence, checkpoint)
        if workflow is None:
            return None
        self._conn.execute(
            "INSERT INTO steps (tenant, workflow_id, step, chat_id, body) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, workflow_id, step) "
            "DO UPDATE SET chat_id = excluded.chat_id, body = excluded.body",
            (
                record.tenant,
                record.workflow_id,
                record.step,
                record.chat_id,
                record.model_dump_json(),
            ),
        )
        return workflow

    async def steps(self, tenant: str, workflow_id: str) -> list[StepRecord]:
        bodies = self._bodies(
            "SELECT body FROM steps WHERE tenant = ? AND workflow_id = ? ORDER BY step",
            (tenant, workflow_id),
        )
        return [parse_row(StepRecord, body, "steps") for body in bodies]

    async def step_view(self, tenant: str, workflow_id: str, step: int) -> StepView:
        # One statement reads from one snapshot of the file (its own read transaction).
        row = self._conn.execute(
            "SELECT "
            "(SELECT body FROM steps "
            " WHERE tenant = :tenant AND workflow_id = :workflow_id AND step = :step), "
            "w.body, "
            "(SELECT c.body FROM chats c WHERE c.tenant = :tenant AND c.chat_id = "
            " CASE WHEN json_valid(w.body) THEN json_extract(w.body, '$.chat_id') END), "
            "p.chat_id, "
            "CASE WHEN json_valid(p.body) THEN json_extract(p.body, '$.last_seen_message_id') END "
            "FROM (SELECT 1) LEFT JOIN workflows w "
            "ON w.tenant = :tenant AND w.workflow_id = :workflow_id "
            "LEFT JOIN steps p ON p.tenant = :tenant AND p.workflow_id = :workflow_id "
            "AND p.step = :step - 1 AND :step > 1",
            {"tenant": tenant, "workflow_id": workflow_id, "step": step},
        ).fetchone()
        return step_view_of(*row)


def _prune_where(rule: PruneRule) -> tuple[str, dict[str, object]]:
    """The rule as a WHERE clause over ``workflows`` (named parameters): ended, in one of
    the rule's states, last written before its time, never a sweep's own record."""
    states = {f"state{i}": state for i, state in enumerate(rule.states)}
    args: dict[str, object] = {
        "tenant": rule.tenant,
        "sweep": SWEEP_PREFIX,
        "before": _stamp(rule.ended_before),
        **states,
    }
    where = (
        "tenant = :tenant AND state <> 'running' "
        f"AND state IN ({', '.join(':' + name for name in states)}) "
        "AND substr(workflow_id, 1, length(:sweep)) <> :sweep "
        "AND julianday(CASE WHEN json_valid(body) THEN json_extract(body, '$.updated_at') END) "
        "< julianday(:before)"
    )
    if rule.deployment is not None:
        where += " AND deployment = :deployment"
        args["deployment"] = rule.deployment
    return where, args


def _row(record: BaseModel, *columns: str, **computed: object) -> dict[str, object]:
    """A record as its table's row: its key columns as they are, the ``computed`` ones,
    and the whole record as the JSON ``body``."""
    row = {name: getattr(record, name) for name in columns}
    return {**row, **computed, "body": record.model_dump_json()}


def _workflow_row(record: WorkflowRecord) -> dict[str, object]:
    beat = _stamp(record.heartbeat_at) if record.heartbeat_at else None
    columns = ("tenant", "workflow_id", "epoch", "deployment")
    return _row(record, *columns, state=str(record.state), heartbeat_at=beat)


def _chat_row(record: ChatRecord) -> dict[str, object]:
    discarded = int(record.discarded)
    return _row(record, "tenant", "chat_id", "workflow_id", discarded=discarded)


def _ledger_row(entry: LedgerEntry) -> dict[str, object]:
    return _row(entry, "tenant", "chat_id", "tool_call_id", "state")


def _stamp(moment: datetime) -> str:
    # UTC, fixed width: heartbeat comparisons are string comparisons in SQL.
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- opening a file ------------------------------------------------------------------------


def _check_ownership(conn: sqlite3.Connection, path: Path, existed: bool) -> None:
    # One read transaction, one snapshot: another process may be creating the store
    # right now, and tables without our application_id would look foreign.
    conn.execute("BEGIN")
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        _rollback(conn)
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


def _user_version(conn: sqlite3.Connection) -> int:
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    return version


def _migrate(conn: sqlite3.Connection) -> None:
    if _user_version(conn) >= SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    current = _user_version(conn)  # read again under the lock: another process may have won
    if current < SCHEMA_VERSION:
        params = {"store_id": uuid.uuid4().hex}
        for version in sorted(v for v in MIGRATIONS if v > current):
            for statement in MIGRATIONS[version].split(";"):
                if statement.strip():
                    conn.execute(statement, params)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.execute("COMMIT")
