"""Ledger blocks: where checkpoints, the journal and the tool ledger are kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from prefect.blocks.core import Block
from pydantic import Field, PrivateAttr, SecretStr

from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.store import DurableStore
from coder_chat.settings import CoderSettings

DOCS_URL = "https://coder.com/docs"


class SqliteLedger(Block):
    """The embedded durable store: one SQLite file on this machine (the default).

    Safe for several processes on one machine; use ``PostgresLedger`` when
    workers on several machines share the work. An empty path means
    ``PREFECT_CODER_SQLITE_PATH``, or ``~/.prefect-coder/ledger.sqlite3``.

    Example:
        Open the store of a saved block:
        ```python
        from blocks import SqliteLedger

        ledger = SqliteLedger.load("BLOCK_NAME")
        store = ledger.get_store()
        ```
    """

    _block_type_name: ClassVar[str] = "Coder SQLite Ledger"
    _block_type_slug: ClassVar[str] = "prefect-coder-sqlite-ledger"
    _documentation_url: ClassVar[Any] = DOCS_URL
    _block_schema_capabilities: ClassVar[list[str]] = ["coder-ledger-store"]

    path: str | None = Field(
        default=None,
        description="Path of the SQLite file (default: PREFECT_CODER_SQLITE_PATH or ~/.prefect-coder/ledger.sqlite3).",
    )
    _store: SqliteStore | None = PrivateAttr(default=None)

    def resolved_path(self) -> Path:
        return (
            Path(self.path).expanduser() if self.path else CoderSettings().sqlite_path.expanduser()
        )

    def get_store(self) -> DurableStore:
        """The store (one per block instance; it works from any event loop)."""
        if self._store is None:
            self._store = SqliteStore(self.resolved_path())
        return self._store


class PostgresLedger(Block):
    """The shared durable store on PostgreSQL (asyncpg), for workers on several machines.

    Example:
        Open the store of a saved block:
        ```python
        from blocks import PostgresLedger

        ledger = PostgresLedger.load("BLOCK_NAME")
        store = ledger.get_store()
        ```
    """

    _block_type_name: ClassVar[str] = "Coder Postgres Ledger"
    _block_type_slug: ClassVar[str] = "prefect-coder-postgres-ledger"
    _documentation_url: ClassVar[Any] = DOCS_URL
    _block_schema_capabilities: ClassVar[list[str]] = ["coder-ledger-store"]

    dsn: SecretStr = Field(
        description="PostgreSQL DSN, e.g. postgresql://user:password@host:5432/db (kept secret).",
    )
    db_schema: str = Field(
        default="prefect_coder",
        title="Schema",
        description="Database schema that holds the store's tables.",
    )
    _store: Any = PrivateAttr(default=None)

    def get_store(self) -> DurableStore:
        """The store; its connection pools are created per event loop, on first use."""
        if self._store is None:
            from coder_chat.durable.postgres import PostgresStore

            self._store = PostgresStore(self.dsn.get_secret_value(), schema=self.db_schema)
        store: DurableStore = self._store
        return store
