"""``PostgresStore``: the durable store in PostgreSQL, through asyncpg.

It behaves like :class:`~coder_chat.durable.sqlite.SqliteStore`: the domain rules
(fencing, epochs, the ledger, finished steps) are :class:`~.base.BaseStore`'s, and
this module holds the SQL, the pools, the transactions and the migrations. The
store lives in its own Postgres schema (``prefect_coder`` unless told otherwise),
so it can share a database.

- **One pool per event loop.** Prefect runs tasks on several loops; an asyncpg
  connection belongs to the loop that opened it. The store keeps a pool per
  running loop, opened lazily, and never hands a pool to another loop. A pool is
  closed with ``close()``, or with its loop: when the loop shuts down its async
  generators (``asyncio.run`` and Prefect's runners do), the pool goes with it.
- **Versioned migrations**, applied on first use under ``pg_advisory_xact_lock``
  in one transaction, so several processes may start at once. A schema written by
  a newer prefect-coder, or one holding tables that are not ours, is refused and
  left untouched.
- **One commit per durable write.** A fenced write reads the workflow row with
  ``FOR UPDATE`` (writes to the row itself) or ``FOR SHARE`` (chat and ledger
  writes) inside its own transaction, so the epoch it checked cannot change
  before it commits.
- **A server restart costs no error**: when an operation's pooled connection turns
  out dead before its transaction did anything (``BEGIN``, or a read's one
  statement, fails with a connection error), the pool's connections are expired
  and the operation runs once more on a fresh one. Nothing else is retried here;
  callers retry on ``CoderStoreError.retryable``.
- **Errors** are :class:`~coder_chat.errors.CoderStoreError`, retryable for
  connection problems, serialization failures and deadlocks. They name host,
  port, database and schema, and never the password.

Known difference from SQLite: JSONB cannot hold the NUL character, so a value
containing ``"\\x00"`` (a tool output, say) is refused with a clear error.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from collections.abc import AsyncGenerator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeAlias, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import asyncpg
from asyncpg import exceptions as pgexc
from asyncpg.pool import PoolConnectionProxy

from ..errors import CoderConfigError, CoderStoreError
from .base import BaseStore, Lock, Op, parse_row
from .records import ChatRecord, LedgerEntry, StepRecord, WorkflowRecord, WorkflowState
from .store import SCHEMA_VERSION

T = TypeVar("T")
Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"
Conn: TypeAlias = "PoolConnectionProxy[asyncpg.Record]"

#: Numbered migrations; ``{s}`` is the quoted schema. The highest is SCHEMA_VERSION.
MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE {s}.workflows (
    tenant TEXT COLLATE "C" NOT NULL,
    workflow_id TEXT COLLATE "C" NOT NULL,
    epoch BIGINT NOT NULL,
    state TEXT NOT NULL,
    deployment TEXT COLLATE "C" NOT NULL,
    heartbeat_at TIMESTAMPTZ,
    body JSONB NOT NULL,
    PRIMARY KEY (tenant, workflow_id)
);
CREATE INDEX workflows_by_deployment ON {s}.workflows (tenant, deployment, state);
CREATE INDEX workflows_by_heartbeat ON {s}.workflows (tenant, heartbeat_at);
CREATE TABLE {s}.chats (
    tenant TEXT COLLATE "C" NOT NULL,
    chat_id TEXT COLLATE "C" NOT NULL,
    workflow_id TEXT COLLATE "C" NOT NULL,
    discarded BOOLEAN NOT NULL,
    body JSONB NOT NULL,
    PRIMARY KEY (tenant, chat_id)
);
CREATE INDEX chats_by_discarded ON {s}.chats (tenant, discarded, chat_id);
CREATE TABLE {s}.ledger (
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    tenant TEXT COLLATE "C" NOT NULL,
    chat_id TEXT COLLATE "C" NOT NULL,
    tool_call_id TEXT COLLATE "C" NOT NULL,
    state TEXT NOT NULL,
    body JSONB NOT NULL,
    PRIMARY KEY (tenant, chat_id, tool_call_id)
);
CREATE INDEX ledger_by_chat ON {s}.ledger (tenant, chat_id, seq);
""",
    # The store id is a uuid4 hex made here, inside the migration, so every process
    # sees the one id and two stores never share one (gen_random_uuid: Postgres 13+).
    2: """
CREATE TABLE {s}.steps (
    tenant TEXT COLLATE "C" NOT NULL,
    workflow_id TEXT COLLATE "C" NOT NULL,
    step BIGINT NOT NULL,
    chat_id TEXT COLLATE "C" NOT NULL,
    body JSONB NOT NULL,
    PRIMARY KEY (tenant, workflow_id, step)
);
CREATE TABLE {s}.meta (key TEXT COLLATE "C" PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO {s}.meta (key, value) VALUES ('store_id', replace(gen_random_uuid()::text, '-', ''));
""",
    # No table changes: finished steps keep their prompt in their JSON body. Code from
    # version 2 would report such a body as malformed (records forbid unknown fields), so
    # the version tells it to upgrade instead; version 2 steps read back with prompt "".
    3: "",
}
assert max(MIGRATIONS) == SCHEMA_VERSION, "every schema version needs its migration"

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
#: SQLSTATEs worth retrying (besides class 08, connection exceptions).
_RETRYABLE_SQLSTATES = frozenset(
    {"40001", "40P01", "55P03", "53300", "53400", "57P01", "57P02", "57P03", "57014"}
)
#: SQLSTATEs of a server that went away under the connection (shutdown, crash, restart).
_GONE_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
_FOREIGN: tuple[type[BaseException], ...] = (
    pgexc.PostgresError,
    pgexc.InterfaceError,
    pgexc.InternalClientError,
    OSError,
)
#: What opening a pool may raise besides: asyncpg's DSN parser raises plain ValueError.
_CONNECT_FAILURES: tuple[type[BaseException], ...] = (*_FOREIGN, ValueError)


# -- the DSN, told without its password --------------------------------------------------


@dataclass(frozen=True)
class _Target:
    hosts: str
    database: str
    user: str
    redacted: str
    secrets: tuple[str, ...] = field(repr=False)

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def mentioned_in(self, exc: BaseException) -> bool:
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            text = f"{current!s} {current!r}"
            if any(secret in text for secret in self.secrets):
                return True
            current = current.__cause__ or current.__context__
        return False


def redact_dsn(dsn: str) -> str:
    """The DSN with its password (in the user info or the query) replaced by ``***``."""
    return _target(dsn).redacted


def _target(dsn: str) -> _Target:
    try:
        parts = urlsplit(dsn)
    except ValueError:
        raise CoderConfigError("the Postgres DSN is not a valid URL") from None
    if parts.scheme not in ("postgres", "postgresql"):
        raise CoderConfigError(
            "a Postgres DSN must look like postgresql://user:password@host:port/database "
            f"(got scheme {parts.scheme!r})"
        )
    userinfo, at, hostinfo = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":") if at else ("", "", "")
    query = parse_qsl(parts.query, keep_blank_values=True)
    params = dict(query)
    secrets = {password, unquote(password), params.get("password", "")} - {""}
    hosts = unquote(hostinfo) or params.get("host", "") or "localhost"
    if "port" in params and ":" not in hosts:
        hosts = f"{hosts}:{params['port']}"
    elif not re.search(r":\d+$", hosts):
        hosts = f"{hosts}:5432"
    netloc = f"{user}:***@{hostinfo}" if colon else parts.netloc
    safe_query = urlencode([(k, "***" if k == "password" else v) for k, v in query])
    redacted = urlunsplit((parts.scheme, netloc, parts.path, safe_query, parts.fragment))
    database = (
        unquote(parts.path.lstrip("/")) or params.get("dbname", "") or params.get("database", "")
    )
    user = unquote(user) or params.get("user", "")
    return _Target(
        hosts=hosts,
        database=database or user or "(default)",
        user=user or "(default)",
        redacted=redacted,
        secrets=tuple(sorted(secrets, key=len, reverse=True)),
    )


# -- one pool per event loop --------------------------------------------------------------


@dataclass(eq=False)
class _LoopPool:
    loop: asyncio.AbstractEventLoop
    opening: asyncio.Task[Pool] | None = None
    pool: Pool | None = None
    keeper: AsyncGenerator[None, None] | None = None
    closed: bool = False
    abandoned: bool = False


async def _keep(entry: _LoopPool) -> AsyncGenerator[None, None]:
    """Parked at ``yield`` while the pool lives; its ``finally`` closes the pool.

    The loop tracks it as an async generator, so ``asyncio.run`` (and every runner
    that calls ``loop.shutdown_asyncgens()``) closes the pool before the loop ends.
    """
    try:
        yield
    finally:
        entry.closed = True
        if entry.pool is not None:
            if entry.abandoned:
                _terminate(entry.pool)
            else:
                try:
                    await entry.pool.close()
                except _FOREIGN:
                    _terminate(entry.pool)


def _terminate(pool: Pool) -> None:
    # Its loop is gone or not ours to run: drop the sockets without awaiting.
    with suppress(RuntimeError, *_FOREIGN):
        pool.terminate()


def _abandon(entry: _LoopPool) -> None:
    """Finish ``entry`` from outside its loop (which is closed or not running)."""
    entry.abandoned = True
    if entry.keeper is None:
        entry.closed = True
        return
    closer = entry.keeper.aclose()
    try:
        closer.send(None)  # the abandoned path never awaits: this runs the finally to its end
    except (StopIteration, RuntimeError):
        pass
    else:  # pragma: no cover - the finally awaited after all
        closer.close()


class PostgresStore(BaseStore):
    """The durable store in Postgres. Create it, use it from any loop, ``await close()``."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "prefect_coder",
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 10.0,
        application_name: str = "prefect-coder",
    ) -> None:
        if not _SCHEMA_NAME.fullmatch(schema):
            raise CoderConfigError(
                f"Postgres schema name {schema!r} must be lowercase letters, digits and "
                "underscores (at most 63, not starting with a digit)"
            )
        if not 0 <= min_size <= max_size or max_size < 1:
            raise CoderConfigError(
                f"pool sizes need 0 <= min_size <= max_size and max_size >= 1 "
                f"(got {min_size}, {max_size})"
            )
        super().__init__()
        self._target = _target(dsn)
        self._dsn = dsn
        self.schema = schema
        self._min_size = min_size
        self._max_size = max_size
        self._connect_timeout = connect_timeout
        self._application_name = application_name
        self._lock_key = int.from_bytes(
            hashlib.blake2b(f"prefect-coder:{schema}".encode(), digest_size=8).digest(),
            "big",
            signed=True,
        )
        self._pools: dict[asyncio.AbstractEventLoop, _LoopPool] = {}
        self._pools_lock = threading.Lock()
        self._migrated = False
        self._sql = _Statements(f'"{schema}"')

    def __repr__(self) -> str:
        return f"PostgresStore(dsn={self._target.redacted!r}, schema={self.schema!r})"

    @property
    def where(self) -> str:
        """``host:port/database (schema …)``, for messages: never the password."""
        return f"{self._target.hosts}/{self._target.database} (schema {self.schema})"

    # -- plumbing -------------------------------------------------------------------------
    def _error(self, exc: BaseException, doing: str, *, lost: bool = False) -> CoderStoreError:
        reason = self._target.scrub(f"{type(exc).__name__}: {exc}".rstrip(": "))
        return CoderStoreError(
            f"Postgres store at {self.where}: {doing} failed: {reason}",
            retryable=lost or _retryable(exc),
        )

    def _raise(self, exc: BaseException, doing: str, *, lost: bool = False) -> NoReturn:
        """Raise ``exc`` translated; call it in the ``except`` block that caught ``exc``.

        ``lost``: the connection died under the operation, so trying again may succeed.
        """
        error = self._error(exc, doing, lost=lost)
        if self._target.mentioned_in(exc):
            raise error from None  # the original would show the password
        raise error from exc

    async def _pool(self) -> Pool:
        loop = asyncio.get_running_loop()
        entry = self._pools.get(loop)
        if entry is not None and entry.pool is not None and not entry.closed:
            return entry.pool
        with self._pools_lock:
            if self._closed:
                raise CoderStoreError(f"{self!r} is closed")
            entry = self._pools.get(loop)
            if entry is None or entry.closed:
                self._forget_dead_loops()
                entry = _LoopPool(loop)
                entry.opening = loop.create_task(self._open(entry))
                entry.opening.add_done_callback(_retrieve)
                self._pools[loop] = entry
        if entry.pool is not None:
            return entry.pool
        assert entry.opening is not None
        return await asyncio.shield(entry.opening)

    def _forget_dead_loops(self) -> None:
        for loop, entry in list(self._pools.items()):
            if loop.is_closed():
                del self._pools[loop]
                _abandon(entry)

    async def _open(self, entry: _LoopPool) -> Pool:
        try:
            pool = await self._create_pool()
            try:
                if not self._migrated:
                    await self._migrate(pool)
                    self._migrated = True
            except BaseException:
                _terminate(pool)
                raise
            entry.pool = pool
            entry.keeper = _keep(entry)
            await entry.keeper.__anext__()
            return pool
        except BaseException:
            with self._pools_lock:
                if self._pools.get(entry.loop) is entry:
                    del self._pools[entry.loop]
            raise

    async def _create_pool(self) -> Pool:
        try:
            return await asyncpg.create_pool(
                self._dsn,
                min_size=self._min_size,
                max_size=self._max_size,
                timeout=self._connect_timeout,
                server_settings={"application_name": self._application_name},
            )
        except _CONNECT_FAILURES as exc:
            target = self._target
            reason = target.scrub(f"{type(exc).__name__}: {exc}")
            error = CoderStoreError(
                f"cannot connect to Postgres at {target.hosts}, database {target.database!r} "
                f"as user {target.user!r}: {reason}",
                retryable=_retryable(exc),
            )
            if target.mentioned_in(exc):
                raise error from None
            raise error from exc

    async def _migrate(self, pool: Pool) -> None:
        try:
            async with pool.acquire() as conn, conn.transaction():
                await self._apply_migrations(conn)
        except _FOREIGN as exc:
            self._raise(exc, "migrating the schema")

    async def _apply_migrations(self, conn: Conn) -> None:
        s = self._sql.s
        await conn.execute("SELECT pg_advisory_xact_lock($1)", self._lock_key)
        has_table = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{s}.migrations")
        if has_table:
            current = await conn.fetchval(f"SELECT coalesce(max(version), 0) FROM {s}.migrations")
        else:
            foreign = await conn.fetchval(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = $1",
                self.schema,
            )
            if foreign:
                raise CoderStoreError(
                    f"Postgres schema {self.schema!r} at {self._target.hosts}/"
                    f"{self._target.database} holds {foreign} object(s) that prefect-coder did "
                    "not create (no migrations table); it was left untouched"
                )
            current = 0
        if current > SCHEMA_VERSION:
            raise CoderStoreError(
                f"Postgres store at {self.where} holds schema version {current}, newer than "
                f"this prefect-coder understands ({SCHEMA_VERSION}); upgrade prefect-coder to "
                "use it (nothing was changed)"
            )
        if current == SCHEMA_VERSION:
            return
        if not has_table:
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
            await conn.execute(
                f"CREATE TABLE {s}.migrations (version INTEGER PRIMARY KEY, "
                "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
        for version in sorted(MIGRATIONS):
            if version > current:
                if MIGRATIONS[version].strip():  # a version may change no table
                    await conn.execute(MIGRATIONS[version].format(s=s))
                await conn.execute(f"INSERT INTO {s}.migrations (version) VALUES ($1)", version)

    # -- transactions -------------------------------------------------------------------
    async def _transact(self, doing: str, op: Op[T], *, write: bool) -> T:
        retried = False
        while True:
            pool = await self._pool()
            attempt = _Attempt()
            try:
                return await self._attempt(pool, op, attempt, write=write)
            except _FOREIGN as exc:
                if not retried and attempt.stale(exc):
                    # The pooled connection died before this operation did anything (a
                    # server restart): nothing happened, so once more on a fresh one.
                    # Its pool-mates most likely died with it: replace them all.
                    retried = True
                    with suppress(*_FOREIGN):
                        await pool.expire_connections()
                    continue
                self._raise(exc, doing, lost=attempt.lost)

    async def _attempt(self, pool: Pool, op: Op[T], attempt: _Attempt, *, write: bool) -> T:
        conn: Conn = await pool.acquire()
        attempt.conn = conn
        try:
            tx = _PgTransaction(conn, self._sql, attempt)
            if not write:
                return await op(tx)
            async with conn.transaction():
                attempt.began = True
                return await op(tx)
        except _FOREIGN:
            # Ask the connection itself, before it goes back to the pool: a dropped one
            # often surfaces as "connection is closed" from the rollback, hiding the cause.
            attempt.lost = _is_closed(conn)
            raise
        finally:
            # Releasing resets the connection; if it died after COMMIT, that fails, and
            # must not turn a committed write into an error (asyncpg drops it anyway).
            with suppress(*_FOREIGN):
                await pool.release(conn)

    async def close(self) -> None:
        """Close every pool: this loop's here, others' on their loops. Safe to repeat."""
        with self._pools_lock:
            self._closed = True
            entries = list(self._pools.values())
            self._pools.clear()
        here = asyncio.get_running_loop()
        for entry in entries:
            if entry.loop is here:
                await _close_entry(entry)
            elif entry.loop.is_closed() or not entry.loop.is_running():
                _abandon(entry)
            else:
                future = asyncio.run_coroutine_threadsafe(_close_entry(entry), entry.loop)
                with suppress(TimeoutError, *_FOREIGN, CoderStoreError):
                    await asyncio.wait_for(asyncio.wrap_future(future), timeout=10)


async def _close_entry(entry: _LoopPool) -> None:
    """On the entry's own loop: let a pending open finish, then close its pool."""
    if entry.opening is not None and not entry.opening.done():
        await asyncio.wait([entry.opening])
    if entry.keeper is not None:
        await entry.keeper.aclose()
    entry.closed = True


def _retrieve(task: asyncio.Task[Pool]) -> None:
    # An open nobody waits for any more (its callers were cancelled) must not log noise.
    if not task.cancelled():
        task.exception()


def _retryable(exc: BaseException) -> bool:
    """A connection problem, a serialization failure or a deadlock (anywhere in the chain)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError | pgexc.ConnectionDoesNotExistError):
            return True
        if isinstance(current, pgexc.PostgresError):
            state = str(getattr(current, "sqlstate", "") or "")
            if state.startswith("08") or state in _RETRYABLE_SQLSTATES:
                return True
        current = current.__cause__ or current.__context__
    return False


@dataclass
class _Attempt:
    """One try of an operation: its connection, and whether anything ran on it yet."""

    conn: Conn | None = None
    #: BEGIN was answered (a write), or a statement was (a read).
    began: bool = False
    #: The connection died under the operation: trying again may succeed.
    lost: bool = False

    def stale(self, exc: BaseException) -> bool:
        """A pooled connection that was dead before anything ran: safe to try again."""
        return self.conn is not None and not self.began and (self.lost or _connection_gone(exc))


def _is_closed(conn: Conn) -> bool:
    try:
        return conn.is_closed()
    except pgexc.InterfaceError:  # closed under us: asyncpg already took it back to the pool
        return True


def _connection_gone(exc: BaseException) -> bool:
    if isinstance(exc, OSError | pgexc.ConnectionDoesNotExistError):
        return True
    state = str(getattr(exc, "sqlstate", "") or "")
    return state.startswith("08") or state in _GONE_SQLSTATES


_LOCKS: dict[Lock, str] = {None: "", "share": " FOR SHARE", "update": " FOR UPDATE"}


class _PgTransaction:
    """The store's rows over one pooled connection (in a transaction, for a write)."""

    def __init__(self, conn: Conn, sql: _Statements, attempt: _Attempt) -> None:
        self._conn = conn
        self._sql = sql
        self._attempt = attempt

    async def _value(self, sql: str, *args: Any) -> Any:
        value = await self._conn.fetchval(sql, *args)
        self._attempt.began = True
        return value

    async def _bodies(self, sql: str, *args: Any) -> list[Any]:
        rows = await self._conn.fetch(sql, *args)
        self._attempt.began = True
        return [row["body"] for row in rows]

    async def store_id(self) -> str | None:
        value = await self._value(self._sql.store_id)
        return None if value is None else str(value)

    # -- workflows
    async def workflow(
        self, tenant: str, workflow_id: str, *, lock: Lock = None
    ) -> WorkflowRecord | None:
        body = await self._value(self._sql.workflow + _LOCKS[lock], tenant, workflow_id)
        return None if body is None else parse_row(WorkflowRecord, body, "workflows")

    async def insert_workflow(self, record: WorkflowRecord) -> bool:
        return bool(await self._value(self._sql.workflow_insert, *_workflow_row(record)))

    async def update_workflow(self, record: WorkflowRecord) -> None:
        await self._value(self._sql.workflow_update, *_workflow_row(record))

    async def workflows(
        self,
        tenant: str,
        deployment: str | None,
        states: Sequence[WorkflowState],
        stale_before: datetime | None,
    ) -> list[WorkflowRecord]:
        sql = f"SELECT body FROM {self._sql.s}.workflows WHERE tenant = $1"
        args: list[Any] = [tenant]
        if deployment is not None:
            args.append(deployment)
            sql += f" AND deployment = ${len(args)}"
        if states:
            args.append([str(s) for s in states])
            sql += f" AND state = ANY(${len(args)}::text[])"
        if stale_before is not None:
            args.append(stale_before.astimezone(UTC))
            sql += f" AND heartbeat_at < ${len(args)}"
        bodies = await self._bodies(sql + " ORDER BY workflow_id", *args)
        return [parse_row(WorkflowRecord, body, "workflows") for body in bodies]

    # -- chats
    async def chat(self, tenant: str, chat_id: str, *, lock: Lock = None) -> ChatRecord | None:
        body = await self._value(self._sql.chat + _LOCKS[lock], tenant, chat_id)
        return None if body is None else parse_row(ChatRecord, body, "chats")

    async def insert_chat(self, record: ChatRecord) -> bool:
        return bool(await self._value(self._sql.chat_insert, *_chat_row(record)))

    async def update_chat(self, record: ChatRecord) -> None:
        await self._value(self._sql.chat_update, *_chat_row(record))

    async def chats(self, tenant: str, discarded: bool | None) -> list[ChatRecord]:
        sql = f"SELECT body FROM {self._sql.s}.chats WHERE tenant = $1"
        args: list[Any] = [tenant]
        if discarded is not None:
            args.append(discarded)
            sql += " AND discarded = $2"
        bodies = await self._bodies(sql + " ORDER BY chat_id", *args)
        return [parse_row(ChatRecord, body, "chats") for body in bodies]

    # -- the ledger
    async def tool(
        self, tenant: str, chat_id: str, tool_call_id: str, *, lock: Lock = None
    ) -> LedgerEntry | None:
        body = await self._value(self._sql.ledger + _LOCKS[lock], tenant, chat_id, tool_call_id)
        return None if body is None else parse_row(LedgerEntry, body, "ledger")

    async def insert_tool(self, entry: LedgerEntry) -> bool:
        return bool(await self._value(self._sql.ledger_insert, *_ledger_row(entry)))

    async def update_tool(self, entry: LedgerEntry) -> None:
        await self._value(self._sql.ledger_update, *_ledger_row(entry))

    async def tools(self, tenant: str, chat_id: str) -> list[LedgerEntry]:
        bodies = await self._bodies(self._sql.ledger_list, tenant, chat_id)
        return [parse_row(LedgerEntry, body, "ledger") for body in bodies]

    # -- finished steps
    async def step(self, tenant: str, workflow_id: str, step: int) -> StepRecord | None:
        body = await self._value(self._sql.step, tenant, workflow_id, step)
        return None if body is None else parse_row(StepRecord, body, "steps")

    async def put_step(self, record: StepRecord) -> None:
        await self._value(
            self._sql.step_put,
            record.tenant,
            record.workflow_id,
            record.step,
            record.chat_id,
            record.model_dump_json(),
        )

    async def steps(self, tenant: str, workflow_id: str) -> list[StepRecord]:
        bodies = await self._bodies(self._sql.step_list, tenant, workflow_id)
        return [parse_row(StepRecord, body, "steps") for body in bodies]


def _workflow_row(record: WorkflowRecord) -> tuple[Any, ...]:
    heartbeat = record.heartbeat_at.astimezone(UTC) if record.heartbeat_at else None
    return (
        record.tenant,
        record.workflow_id,
        record.epoch,
        str(record.state),
        record.deployment,
        heartbeat,
        record.model_dump_json(),
    )


def _chat_row(record: ChatRecord) -> tuple[Any, ...]:
    return (
        record.tenant,
        record.chat_id,
        record.workflow_id,
        record.discarded,
        record.model_dump_json(),
    )


def _ledger_row(entry: LedgerEntry) -> tuple[Any, ...]:
    return (entry.tenant, entry.chat_id, entry.tool_call_id, entry.state, entry.model_dump_json())


class _Statements:
    """The store's SQL, qualified with its schema; values only ever as ``$n``."""

    def __init__(self, s: str) -> None:
        self.s = s
        self.store_id = f"SELECT value FROM {s}.meta WHERE key = 'store_id'"
        self.workflow = f"SELECT body FROM {s}.workflows WHERE tenant = $1 AND workflow_id = $2"
        self.workflow_insert = (
            f"INSERT INTO {s}.workflows "
            "(tenant, workflow_id, epoch, state, deployment, heartbeat_at, body) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7) "
            "ON CONFLICT (tenant, workflow_id) DO NOTHING RETURNING true"
        )
        self.workflow_update = (
            f"UPDATE {s}.workflows SET epoch = $3, state = $4, deployment = $5, "
            "heartbeat_at = $6, body = $7 WHERE tenant = $1 AND workflow_id = $2"
        )
        self.chat = f"SELECT body FROM {s}.chats WHERE tenant = $1 AND chat_id = $2"
        self.chat_insert = (
            f"INSERT INTO {s}.chats (tenant, chat_id, workflow_id, discarded, body) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, chat_id) DO NOTHING RETURNING true"
        )
        self.chat_update = (
            f"UPDATE {s}.chats SET workflow_id = $3, discarded = $4, body = $5 "
            "WHERE tenant = $1 AND chat_id = $2"
        )
        self.ledger = (
            f"SELECT body FROM {s}.ledger WHERE tenant = $1 AND chat_id = $2 AND tool_call_id = $3"
        )
        self.ledger_insert = (
            f"INSERT INTO {s}.ledger (tenant, chat_id, tool_call_id, state, body) "
            "VALUES ($1, $2, $3, $4, $5) "
            "ON CONFLICT (tenant, chat_id, tool_call_id) DO NOTHING RETURNING true"
        )
        self.ledger_update = (
            f"UPDATE {s}.ledger SET state = $4, body = $5 "
            "WHERE tenant = $1 AND chat_id = $2 AND tool_call_id = $3"
        )
        self.ledger_list = (
            f"SELECT body FROM {s}.ledger WHERE tenant = $1 AND chat_id = $2 ORDER BY seq"
        )
        self.step = (
            f"SELECT body FROM {s}.steps WHERE tenant = $1 AND workflow_id = $2 AND step = $3"
        )
        self.step_put = (
            f"INSERT INTO {s}.steps (tenant, workflow_id, step, chat_id, body) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, workflow_id, step) "
            "DO UPDATE SET chat_id = EXCLUDED.chat_id, body = EXCLUDED.body"
        )
        self.step_list = (
            f"SELECT body FROM {s}.steps WHERE tenant = $1 AND workflow_id = $2 ORDER BY step"
        )
