"""``PostgresStore``: the durable store in PostgreSQL, through asyncpg.

It behaves like :class:`~coder_chat.durable.sqlite.SqliteStore`: the domain rules
(fencing, epochs, the ledger, finished steps) are :class:`~.base.DurableStore`'s, and
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
- **One statement per durable write, one round trip.** A write sends no ``BEGIN``
  and no ``COMMIT``: its one statement is its transaction. It checks the fence in
  that statement: a write to the workflow row updates it ``WHERE epoch = $n``; a
  write to another table takes the workflow row ``FOR SHARE`` at that epoch, so a
  new run's ``begin_run`` cannot slip between the check and the write. Only when it
  matched nothing does the store look again, to say why (:class:`FencedOut` or a
  missing ledger entry). Released connections need no reset query either.
- **A server restart costs no error**: before a pooled connection is used, its
  socket is checked (no round trip) for what a server leaves on an idle connection
  it closed; such a connection is replaced, with its pool-mates. A read whose
  connection still dies before its statement is answered runs once more on a fresh
  one. A write is never retried here (once sent, it may have landed): callers retry
  on ``CoderStoreError.retryable``.
- **Errors** are :class:`~coder_chat.errors.CoderStoreError`, retryable for
  connection problems, serialization failures and deadlocks. They name host,
  port, database and schema, and never the password.

Known differences from SQLite: JSONB cannot hold the NUL character, so a value
containing ``"\\x00"`` (a tool output, say) is refused with a clear error. And a
row that no longer parses (something else wrote it) is reported by a write to it
after the write's one statement merged its changes in; SQLite reports it before.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import select
import threading
from collections.abc import AsyncGenerator
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any, NoReturn, TypeAlias, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import asyncpg
from asyncpg import exceptions as pgexc
from asyncpg.pool import PoolConnectionProxy
from pydantic import BaseModel

from ..errors import CoderConfigError, CoderStoreError
from .base import (
    SWEEP_PREFIX,
    Changes,
    DurableStore,
    Op,
    PruneRule,
    WorkflowQuery,
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


class PostgresStore(DurableStore):
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
                reset=_nothing_to_reset,
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
            await self._create_schema(conn)
            await conn.execute(
                f"CREATE TABLE {s}.migrations (version INTEGER PRIMARY KEY, "
                "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
        for version in sorted(MIGRATIONS):
            if version > current:
                if MIGRATIONS[version].strip():  # a version may change no table
                    await conn.execute(MIGRATIONS[version].format(s=s))
                await conn.execute(f"INSERT INTO {s}.migrations (version) VALUES ($1)", version)

    async def _create_schema(self, conn: Conn) -> None:
        """The schema, unless it is there: a role that owns a schema an administrator made
        for it needs no right to create one (``CREATE SCHEMA IF NOT EXISTS`` asks for it)."""
        made = await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", self.schema)
        if made:
            return
        try:
            await conn.execute(f"CREATE SCHEMA {self._sql.s}")
        except pgexc.InsufficientPrivilegeError:
            target = self._target
            raise CoderStoreError(
                f"Postgres user {target.user!r} may not create the store's schema "
                f"{self.schema!r} in database {target.database!r} at {target.hosts}: have an "
                f"administrator create it for that user (CREATE SCHEMA {self.schema} "
                f"AUTHORIZATION {target.user}), or give the store a schema the user owns"
            ) from None

    # -- transactions -------------------------------------------------------------------
    async def _transact(self, doing: str, op: Op[T], *, write: bool, flush: bool = True) -> T:
        # Every write is flushed (``flush`` is not used): Postgres could defer one
        # (``synchronous_commit = off``), but a server that crashes while our runs live on
        # would lose it behind their backs, and a later write would not bring it back.
        retried = False
        while True:
            pool = await self._pool()
            attempt = _Attempt()
            try:
                return await self._attempt(pool, op, attempt, write=write)
            except _FOREIGN as exc:
                if not retried and attempt.stale(exc):
                    # A read's connection died before its statement was answered (a server
                    # restart): nothing happened, so once more on a fresh one. Its
                    # pool-mates most likely died with it: replace them all.
                    retried = True
                    with suppress(*_FOREIGN):
                        await pool.expire_connections()
                    continue
                self._raise(exc, doing, lost=attempt.lost)

    async def _attempt(self, pool: Pool, op: Op[T], attempt: _Attempt, *, write: bool) -> T:
        conn = await _acquire_live(pool)
        attempt.conn = conn
        try:
            if write:
                # No BEGIN, no COMMIT: a write is one statement, its own transaction. Once
                # it went out it may have landed, so a failure from here is never retried.
                attempt.began = True
            return await op(_PgTransaction(conn, self._sql, attempt))
        except _FOREIGN:
            # Ask the connection itself, before it goes back to the pool: one that died
            # under the operation makes the error retryable, whatever asyncpg raised.
            attempt.lost = _is_closed(conn)
            raise
        finally:
            # If the connection died after the write landed, releasing it fails, and that
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
    #: A write's statement is going out, or a read's statement was answered.
    began: bool = False
    #: The connection died under the operation: trying again may succeed.
    lost: bool = False

    def stale(self, exc: BaseException) -> bool:
        """A read's pooled connection that was dead before its statement ran: try again."""
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


async def _nothing_to_reset(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """What a connection needs before it goes back to the pool: nothing.

    The store leaves no session state behind (no SET, LISTEN, cursors or session
    advisory locks; asyncpg itself rolls back a transaction left open before calling
    this), so asyncpg's default reset query would only cost a round trip per operation.
    """


async def _acquire_live(pool: Pool) -> Conn:
    """A pooled connection the server has not closed, found without a round trip.

    A server restart (or crash, or idle timeout) closes the pool's idle connections, and
    a busy loop may not have noticed yet. Such a connection is never used: nothing was
    sent on it, the pool's connections are all replaced (they most likely went
    together), and a fresh one is taken.
    """
    conn: Conn = await pool.acquire()
    if not _closed_by_server(conn):
        return conn
    conn.terminate()  # this also hands it back to the pool, closed
    await pool.expire_connections()
    fresh: Conn = await pool.acquire()
    return fresh


def _closed_by_server(conn: Conn) -> bool:
    """Whether the server closed this idle connection.

    An idle connection has nothing to read: anything waiting on its socket is the
    server's farewell (FATAL "terminating connection", then the end of the stream),
    left there while the loop was busy and asyncpg could not see it.
    """
    if _is_closed(conn):
        return True
    transport = getattr(conn, "_transport", None)  # asyncpg's, reached through the proxy
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or not hasattr(select, "poll"):
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))  # readable, hung up or failed


class _PgTransaction:
    """The store's rows over one pooled connection.

    Every statement is its own transaction: a read is one statement (one snapshot),
    and so is each fenced write, which checks the epoch and writes in the same
    statement (one round trip). An operation issues at most one write statement; a
    second would not be atomic with the first, so it is refused.
    """

    def __init__(self, conn: Conn, sql: _Statements, attempt: _Attempt) -> None:
        self._conn = conn
        self._sql = sql
        self._attempt = attempt
        self._wrote = False

    async def _value(self, sql: str, *args: Any) -> Any:
        value = await self._conn.fetchval(sql, *args)
        self._attempt.began = True
        return value

    async def _row(self, sql: str, *args: Any) -> asyncpg.Record | None:
        row = await self._conn.fetchrow(sql, *args)
        self._attempt.began = True
        return row

    async def _bodies(self, sql: str, *args: Any) -> list[Any]:
        rows = await self._conn.fetch(sql, *args)
        self._attempt.began = True
        return [row["body"] for row in rows]

    def _writing(self) -> None:
        if self._wrote:
            raise RuntimeError("a Postgres store operation issued a second write statement")
        self._wrote = True

    async def _written(self, sql: str, *args: Any) -> Any:
        """The one write of an operation: its statement's answer (one value)."""
        self._writing()
        return await self._value(sql, *args)

    async def store_id(self) -> str | None:
        value = await self._value(self._sql.store_id)
        return None if value is None else str(value)

    # -- workflows
    async def workflow(self, tenant: str, workflow_id: str) -> WorkflowRecord | None:
        body = await self._value(self._sql.workflow, tenant, workflow_id)
        return None if body is None else parse_row(WorkflowRecord, body, "workflows")

    async def start_run(self, new: WorkflowRecord, run: Changes) -> WorkflowRecord:
        body = await self._written(
            self._sql.start_run, *_workflow_row(new), _changes(WorkflowRecord, run)
        )
        return parse_row(WorkflowRecord, body, "workflows")

    async def update_workflow(self, fence: Fence, changes: Changes) -> WorkflowRecord | None:
        body = await self._written(
            self._sql.update_workflow, *_fence(fence), _changes(WorkflowRecord, changes)
        )
        return None if body is None else parse_row(WorkflowRecord, body, "workflows")

    async def workflows(self, query: WorkflowQuery) -> list[WorkflowRecord]:
        sql = f"SELECT body FROM {self._sql.s}.workflows WHERE tenant = $1"
        args: list[Any] = [query.tenant]
        if query.deployment is not None:
            args.append(query.deployment)
            sql += f" AND deployment = ${len(args)}"
        if query.states:
            args.append([str(s) for s in query.states])
            sql += f" AND state = ANY(${len(args)}::text[])"
        if query.stale_before is not None:
            args.append(query.stale_before.astimezone(UTC))
            sql += f" AND heartbeat_at < ${len(args)}"
        bodies = await self._bodies(sql + " ORDER BY workflow_id", *args)
        return [parse_row(WorkflowRecord, body, "workflows") for body in bodies]

    # -- chats
    async def chat(self, tenant: str, chat_id: str) -> ChatRecord | None:
        body = await self._value(self._sql.chat, tenant, chat_id)
        return None if body is None else parse_row(ChatRecord, body, "chats")

    async def upsert_chat(
        self, fence: Fence, new: ChatRecord, changes: Changes
    ) -> ChatRecord | None:
        body = await self._written(
            self._sql.upsert_chat,
            *_fence(fence),
            new.chat_id,
            new.discarded,
            new.model_dump_json(),
            _changes(ChatRecord, changes),
        )
        return None if body is None else parse_row(ChatRecord, body, "chats")

    async def chats(self, tenant: str, discarded: bool | None) -> list[ChatRecord]:
        sql = f"SELECT body FROM {self._sql.s}.chats WHERE tenant = $1"
        args: list[Any] = [tenant]
        if discarded is not None:
            args.append(discarded)
            sql += " AND discarded = $2"
        bodies = await self._bodies(sql + " ORDER BY chat_id", *args)
        return [parse_row(ChatRecord, body, "chats") for body in bodies]

    async def workflow_chats(self, tenant: str, workflow_id: str) -> list[ChatRecord]:
        bodies = await self._bodies(self._sql.workflow_chats, tenant, workflow_id)
        return [parse_row(ChatRecord, body, "chats") for body in bodies]

    # -- pruning
    async def prunable(self, rule: PruneRule) -> list[WorkflowRecord]:
        bodies = await self._bodies(self._sql.prunable, *_prune_args(rule))
        return [parse_row(WorkflowRecord, body, "workflows") for body in bodies]

    async def prune(self, rule: PruneRule) -> list[str]:
        ids = await self._written(self._sql.prune, *_prune_args(rule))
        return [str(i) for i in ids]

    # -- the ledger
    async def tool(self, tenant: str, chat_id: str, tool_call_id: str) -> LedgerEntry | None:
        body = await self._value(self._sql.ledger, tenant, chat_id, tool_call_id)
        return None if body is None else parse_row(LedgerEntry, body, "ledger")

    async def claim_tool(
        self, fence: Fence, entry: LedgerEntry
    ) -> tuple[bool, LedgerEntry | None] | None:
        self._writing()
        row = await self._row(
            self._sql.claim_tool,
            *_fence(fence),
            entry.chat_id,
            entry.tool_call_id,
            entry.state,
            entry.model_dump_json(),
        )
        assert row is not None  # a SELECT without FROM answers one row
        if not row["holds"]:
            return None
        if row["won"] is not None:
            return True, parse_row(LedgerEntry, row["won"], "ledger")
        held = row["held"]
        return False, None if held is None else parse_row(LedgerEntry, held, "ledger")

    async def complete_tool(
        self, fence: Fence, chat_id: str, tool_call_id: str, changes: Changes
    ) -> LedgerEntry | None:
        body = await self._written(
            self._sql.complete_tool,
            *_fence(fence),
            chat_id,
            tool_call_id,
            _changes(LedgerEntry, changes),
        )
        return None if body is None else parse_row(LedgerEntry, body, "ledger")

    async def tools(self, tenant: str, chat_id: str) -> list[LedgerEntry]:
        bodies = await self._bodies(self._sql.ledger_list, tenant, chat_id)
        return [parse_row(LedgerEntry, body, "ledger") for body in bodies]

    # -- finished steps
    async def step(self, tenant: str, workflow_id: str, step: int) -> StepRecord | None:
        body = await self._value(self._sql.step, tenant, workflow_id, step)
        return None if body is None else parse_row(StepRecord, body, "steps")

    async def complete_step(
        self, fence: Fence, checkpoint: Changes, record: StepRecord
    ) -> WorkflowRecord | None:
        body = await self._written(
            self._sql.complete_step,
            *_fence(fence),
            _changes(WorkflowRecord, checkpoint),
            record.step,
            record.chat_id,
            record.model_dump_json(),
        )
        return None if body is None else parse_row(WorkflowRecord, body, "workflows")

    async def steps(self, tenant: str, workflow_id: str) -> list[StepRecord]:
        bodies = await self._bodies(self._sql.step_list, tenant, workflow_id)
        return [parse_row(StepRecord, body, "steps") for body in bodies]

    async def step_view(self, tenant: str, workflow_id: str, step: int) -> StepView:
        row = await self._row(self._sql.step_view, tenant, workflow_id, step)
        assert row is not None  # one row, whatever exists
        return step_view_of(
            row["step"],
            row["workflow"],
            row["chat"],
            row["previous_chat_id"],
            row["previous_cursor"],
        )


def _fence(fence: Fence) -> tuple[str, str, int]:
    return (fence.tenant, fence.workflow_id, fence.epoch)


def _changes(model: type[BaseModel], changes: Changes) -> str:
    """``changes`` as a JSON object, each field serialized exactly as ``model`` stores it."""
    return model.model_construct(**changes).model_dump_json(include=set(changes))


def _prune_args(rule: PruneRule) -> tuple[Any, ...]:
    return (rule.tenant, list(rule.states), SWEEP_PREFIX, rule.ended_before, rule.deployment)


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


class _Statements:
    """The store's SQL, qualified with its schema; values only ever as ``$n``.

    A fenced write is one statement: ``$1, $2, $3`` are the fence (tenant, workflow id,
    epoch). A write to the workflow row updates it ``WHERE epoch = $3``; a write to
    another table first takes the workflow row ``FOR SHARE`` at that epoch (the ``fence``
    CTE), so a concurrent ``begin_run`` waits until the write commits, or wins first and
    the write matches nothing. Changes are merged into the stored JSON body (``||``
    replaces top-level fields whole); the columns that mirror body fields follow.
    """

    def __init__(self, s: str) -> None:
        self.s = s
        self._reads(s)
        self._run_writes(s)
        self._prunes(s)
        self._fenced_writes(s)

    def _reads(self, s: str) -> None:
        self.store_id = f"SELECT value FROM {s}.meta WHERE key = 'store_id'"
        self.workflow = f"SELECT body FROM {s}.workflows WHERE tenant = $1 AND workflow_id = $2"
        self.chat = f"SELECT body FROM {s}.chats WHERE tenant = $1 AND chat_id = $2"
        self.ledger = (
            f"SELECT body FROM {s}.ledger WHERE tenant = $1 AND chat_id = $2 AND tool_call_id = $3"
        )
        self.ledger_list = (
            f"SELECT body FROM {s}.ledger WHERE tenant = $1 AND chat_id = $2 ORDER BY seq"
        )
        self.step = (
            f"SELECT body FROM {s}.steps WHERE tenant = $1 AND workflow_id = $2 AND step = $3"
        )
        self.step_list = (
            f"SELECT body FROM {s}.steps WHERE tenant = $1 AND workflow_id = $2 ORDER BY step"
        )
        self.step_view = (
            "SELECT "
            f"(SELECT body FROM {s}.steps "
            "  WHERE tenant = $1 AND workflow_id = $2 AND step = $3) AS step, "
            "w.body AS workflow, "
            f"(SELECT c.body FROM {s}.chats c "
            "  WHERE c.tenant = $1 AND c.chat_id = (w.body ->> 'chat_id') COLLATE \"C\") AS chat, "
            "p.chat_id AS previous_chat_id, "
            "(p.body ->> 'last_seen_message_id')::bigint AS previous_cursor "
            f"FROM (VALUES (1)) AS one LEFT JOIN {s}.workflows w "
            "ON w.tenant = $1 AND w.workflow_id = $2 "
            f"LEFT JOIN {s}.steps p "
            "ON p.tenant = $1 AND p.workflow_id = $2 AND p.step = $3 - 1 AND $3 > 1"
        )
        self.workflow_chats = (
            f"SELECT body FROM {s}.chats WHERE tenant = $1 AND workflow_id = $2 ORDER BY chat_id"
        )

    def _run_writes(self, s: str) -> None:
        """Writes to the workflow row: a run's epoch taken, its record updated, a step
        finished with its checkpoint."""
        # Inserted at epoch 1 ($1-$7: the new row), or the next epoch with the run's fields ($8).
        self.start_run = (
            f"INSERT INTO {s}.workflows AS w "
            "(tenant, workflow_id, epoch, state, deployment, heartbeat_at, body) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7) "
            "ON CONFLICT (tenant, workflow_id) DO UPDATE SET epoch = w.epoch + 1, "
            "state = EXCLUDED.state, deployment = EXCLUDED.deployment, "
            "heartbeat_at = EXCLUDED.heartbeat_at, "
            "body = w.body || $8::jsonb || jsonb_build_object('epoch', w.epoch + 1) "
            "RETURNING body"
        )
        self.update_workflow = (
            f"UPDATE {s}.workflows SET body = body || $4::jsonb, "
            "state = coalesce($4::jsonb ->> 'state', state), "
            "deployment = coalesce($4::jsonb ->> 'deployment', deployment), "
            "heartbeat_at = coalesce(($4::jsonb ->> 'heartbeat_at')::timestamptz, heartbeat_at) "
            "WHERE tenant = $1 AND workflow_id = $2 AND epoch = $3 RETURNING body"
        )
        # The checkpoint ($4) and the step's row ($5-$7), in one statement: both or neither.
        self.complete_step = (
            f"WITH checkpoint AS ({self.update_workflow}), "
            f"step AS (INSERT INTO {s}.steps (tenant, workflow_id, step, chat_id, body) "
            "SELECT $1, $2, $5::bigint, $6::text, $7::jsonb FROM checkpoint "
            "ON CONFLICT (tenant, workflow_id, step) "
            "DO UPDATE SET chat_id = EXCLUDED.chat_id, body = EXCLUDED.body) "
            "SELECT body FROM checkpoint"
        )

    def _prunes(self, s: str) -> None:
        # A prune's rule ($1 tenant, $2 states, $3 the sweep's prefix, $4 ended before,
        # $5 deployment or null): ended, never running, never a sweep's own record.
        doomed = (
            "tenant = $1 AND state <> 'running' AND state = ANY($2::text[]) "
            "AND substr(workflow_id, 1, length($3::text)) <> $3::text "
            "AND (body ->> 'updated_at')::timestamptz < $4::timestamptz "
            "AND ($5::text IS NULL OR deployment = $5::text)"
        )
        self.prunable = f"SELECT body FROM {s}.workflows WHERE {doomed} ORDER BY workflow_id"
        # One statement: the workflows, their steps, their chats and the ledger entries of
        # every chat they name (journaled, a step's, the checkpoint's); all or nothing.
        self.prune = (
            f"WITH gone AS (DELETE FROM {s}.workflows WHERE {doomed} "
            "  RETURNING workflow_id, body ->> 'chat_id' AS chat_id), "
            f"steps AS (DELETE FROM {s}.steps WHERE tenant = $1 "
            "  AND workflow_id IN (SELECT workflow_id FROM gone) RETURNING chat_id), "
            f"chats AS (DELETE FROM {s}.chats WHERE tenant = $1 "
            "  AND workflow_id IN (SELECT workflow_id FROM gone) RETURNING chat_id), "
            f"ledger AS (DELETE FROM {s}.ledger WHERE tenant = $1 AND chat_id IN ("
            "  SELECT chat_id FROM chats UNION SELECT chat_id FROM steps "
            '  UNION SELECT chat_id COLLATE "C" FROM gone WHERE chat_id IS NOT NULL)) '
            "SELECT coalesce(array_agg(workflow_id ORDER BY workflow_id), '{}') FROM gone"
        )

    def _fenced_writes(self, s: str) -> None:
        """Writes to the chats and the ledger, each fenced by the workflow row's epoch."""
        fence = (
            f"fence AS MATERIALIZED (SELECT 1 FROM {s}.workflows "
            "WHERE tenant = $1 AND workflow_id = $2 AND epoch = $3 FOR SHARE)"
        )
        # A new chat ($4-$6), or the changes ($7) to the one there.
        self.upsert_chat = (
            f"WITH {fence} "
            f"INSERT INTO {s}.chats AS c (tenant, chat_id, workflow_id, discarded, body) "
            "SELECT $1, $4::text, $2, $5::boolean, $6::jsonb FROM fence "
            "ON CONFLICT (tenant, chat_id) DO UPDATE SET body = c.body || $7::jsonb, "
            "discarded = coalesce(($7::jsonb ->> 'discarded')::boolean, c.discarded) "
            "RETURNING body"
        )
        # holds: the fence held; won: the entry inserted ($4-$7); held: the entry there
        # before this statement's snapshot (a racer committing later is not seen).
        self.claim_tool = (
            f"WITH {fence}, claimed AS ("
            f"INSERT INTO {s}.ledger (tenant, chat_id, tool_call_id, state, body) "
            "SELECT $1, $4::text, $5::text, $6::text, $7::jsonb FROM fence "
            "ON CONFLICT (tenant, chat_id, tool_call_id) DO NOTHING RETURNING body) "
            "SELECT EXISTS (SELECT 1 FROM fence) AS holds, "
            "(SELECT body FROM claimed) AS won, "
            f"(SELECT body FROM {s}.ledger "
            "  WHERE tenant = $1 AND chat_id = $4 AND tool_call_id = $5) AS held"
        )
        self.complete_tool = (
            f"WITH {fence} "
            f"UPDATE {s}.ledger AS l SET body = l.body || $6::jsonb, "
            "state = coalesce($6::jsonb ->> 'state', l.state) FROM fence "
            "WHERE l.tenant = $1 AND l.chat_id = $4 AND l.tool_call_id = $5 RETURNING l.body"
        )
