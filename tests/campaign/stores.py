"""Where a schedule's durable store lives: a SQLite file, or a schema on a private Postgres.

A Postgres schedule gets a :class:`~tests.pgcluster.PgCluster` of its own for its
duration (from a pool: one server per schedule running at once, so restarting it
disturbs no other schedule), a fresh schema, and a ``PostgresLedger`` block saved
in the Prefect API that its children name as their ``ledger``.
"""

from __future__ import annotations

import asyncio
import importlib
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
from pydantic import SecretStr

from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.store import DurableStore
from prefect_coder.blocks import PostgresLedger
from tests.pgcluster import PgCluster, PgClusterUnavailable, _bindir

POSTGRES_BLOCK_SLUG = "prefect-coder-postgres-ledger"
#: A workflow's rows, table by table ($1: tenant, $2: workflow id; {chats}: the chats table).
_WORKFLOW_ROWS = (
    ("workflows", "tenant = $1 AND workflow_id = $2"),
    ("steps", "tenant = $1 AND workflow_id = $2"),
    ("chats", "tenant = $1 AND workflow_id = $2"),
    (
        "ledger",
        "tenant = $1 AND chat_id IN (SELECT chat_id FROM {chats} WHERE tenant = $1 "
        "AND workflow_id = $2)",
    ),
)


def postgres_unusable() -> str | None:
    """Why the Postgres variant cannot run here (no server binaries, or a store that
    does not import), or ``None`` when it can."""
    try:
        _bindir()
        importlib.import_module("coder_chat.durable.postgres")
    except PgClusterUnavailable as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - whatever breaks the import is the reason
        return f"the Postgres store does not import ({type(exc).__name__}: {exc})"
    return None


@dataclass
class ClusterPool:
    """Private Postgres servers, created on demand and lent to one schedule at a time."""

    idle: list[PgCluster] = field(default_factory=list)
    every: list[PgCluster] = field(default_factory=list)

    async def acquire(self) -> PgCluster:
        if self.idle:
            return self.idle.pop()
        cluster = await asyncio.to_thread(lambda: PgCluster().start())
        self.every.append(cluster)
        return cluster

    def release(self, cluster: PgCluster) -> None:
        self.idle.append(cluster)

    async def close(self) -> None:
        for cluster in self.every:
            await asyncio.to_thread(cluster.destroy)
        self.every.clear()
        self.idle.clear()


@dataclass
class StoreSite:
    """One schedule's store: how children name it, how this process opens and dumps it."""

    sqlite_path: Path
    cluster: PgCluster | None = None
    schema: str = ""
    #: What children pass as ``ledger`` (``None``: the SQLite file of their environment).
    ledger_block: str | None = None

    @classmethod
    def sqlite(cls, root: Path) -> StoreSite:
        return cls(root / "ledger.sqlite3")

    @classmethod
    async def postgres(cls, root: Path, cluster: PgCluster, name: str) -> StoreSite:
        schema = "campaign_" + name.replace("-", "_")
        block = PostgresLedger(dsn=SecretStr(cluster.dsn), db_schema=schema)
        await block.asave(name, overwrite=True)
        return cls(root / "ledger.sqlite3", cluster, schema, f"{POSTGRES_BLOCK_SLUG}/{name}")

    def open(self) -> DurableStore:
        if self.cluster is not None:
            # Imported here: the campaign checks first that it imports (see postgres_unusable).
            from coder_chat.durable.postgres import PostgresStore

            return PostgresStore(self.cluster.dsn, schema=self.schema)
        return SqliteStore(self.sqlite_path)

    async def restart(self) -> None:
        """Restart the Postgres server at once (every connection dies, as in a crash)."""
        assert self.cluster is not None
        await asyncio.to_thread(self.cluster.restart)

    def files(self) -> list[Path]:
        """The store's files on disk (the SQLite database and its WAL and shared memory)."""
        return sorted(self.sqlite_path.parent.glob(f"{self.sqlite_path.name}*"))

    async def rows(self) -> dict[str, bytes]:
        """Every row of the Postgres schema's tables as text, by table (empty for SQLite)."""
        if self.cluster is None:
            return {}
        conn = await asyncpg.connect(self.cluster.dsn)
        try:
            tables = await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
                self.schema,
            )
            dump: dict[str, bytes] = {}
            for table in tables:
                name = f'"{self.schema}"."{table["table_name"]}"'
                rows = await conn.fetch(f"SELECT t::text AS row FROM {name} t")
                dump[f"postgres {table['table_name']}"] = "\n".join(r["row"] for r in rows).encode()
            return dump
        finally:
            await conn.close()

    async def workflow_rows(self, tenant: str, workflow_id: str) -> dict[str, list[str]]:
        """The workflow's rows exactly as stored (its workflow, steps, chats and their ledger
        entries), by table, read raw: what a refused run must leave byte for byte."""
        if self.cluster is None:
            return await asyncio.to_thread(self._sqlite_rows, tenant, workflow_id)
        conn = await asyncpg.connect(self.cluster.dsn)
        try:
            rows: dict[str, list[str]] = {}
            for table, where in _WORKFLOW_ROWS:
                name = f'"{self.schema}"."{table}"'
                where = where.replace("{chats}", f'"{self.schema}".chats')
                found = await conn.fetch(
                    f"SELECT t::text AS row FROM {name} t WHERE {where} ORDER BY t::text",
                    tenant,
                    workflow_id,
                )
                rows[table] = [r["row"] for r in found]
            return rows
        finally:
            await conn.close()

    def _sqlite_rows(self, tenant: str, workflow_id: str) -> dict[str, list[str]]:
        conn = sqlite3.connect(f"file:{self.sqlite_path}?mode=ro", uri=True, timeout=30)
        try:
            rows: dict[str, list[str]] = {}
            for table, where in _WORKFLOW_ROWS:
                where = where.replace("$1", "?1").replace("$2", "?2").replace("{chats}", "chats")
                found = conn.execute(f"SELECT * FROM {table} WHERE {where}", (tenant, workflow_id))
                rows[table] = sorted(repr(row) for row in found.fetchall())
            return rows
        finally:
            conn.close()

    async def drop(self) -> None:
        if self.cluster is None:
            return
        conn = await asyncpg.connect(self.cluster.dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        finally:
            await conn.close()
