"""Ledger blocks: where checkpoints, the journal and the tool ledger are kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.store import DurableStore
from coder_chat.settings import CoderSettings
from prefect_coder.blocks._project import DOCS_URL, LogoUrl
from prefect_coder.blocks._shared import shared_store


class SqliteLedger(Block):
    """The embedded durable store: one SQLite file on this machine (the default).

    Example:
        Open the store of a saved block (in async code, such as an async flow, load
        with ``await SqliteLedger.aload("BLOCK_NAME")``):
        ```python
        from prefect_coder.blocks import SqliteLedger

        store = SqliteLedger.load("BLOCK_NAME").get_store()
        ```
    """

    _block_type_name: ClassVar[str] = "Coder SQLite Ledger"
    _block_type_slug: ClassVar[str] = "prefect-coder-sqlite-ledger"
    _description: ClassVar[str] = (
        "Where prefect-coder keeps each workflow's checkpoint, journal, finished steps and "
        "tool ledger: one SQLite file on the worker's machine. Safe for several processes on "
        "one machine; use the Coder Postgres Ledger when workers on several machines share "
        "the work. A flow given no ledger uses PREFECT_CODER_SQLITE_PATH, or "
        "~/.prefect-coder/ledger.sqlite3."
    )
    _documentation_url: ClassVar[Any] = DOCS_URL
    _logo_url: ClassVar[Any] = LogoUrl()
    _block_schema_capabilities: ClassVar[list[str]] = ["coder-ledger-store"]

    # Required, so that a saved block's reference can never also read as its fields.
    path: str = Field(
        title="Path",
        description="The SQLite file, e.g. /var/lib/prefect-coder/ledger.sqlite3.",
    )

    @classmethod
    def default(cls) -> SqliteLedger:
        """The embedded store: ``PREFECT_CODER_SQLITE_PATH`` or ``~/.prefect-coder/ledger.sqlite3``."""
        return cls(path="")

    def resolved_path(self) -> Path:
        return (
            Path(self.path).expanduser() if self.path else CoderSettings().sqlite_path.expanduser()
        )

    def get_store(self) -> DurableStore:
        """The store this process shares for this file (works from any event loop).

        Do not close it: every task of the process uses it; it closes when the process exits.
        """
        path = self.resolved_path().resolve()
        return shared_store(("sqlite", str(path)), lambda: SqliteStore(path))


class PostgresLedger(Block):
    """The shared durable store on PostgreSQL, for workers on several machines.

    Example:
        Open the store of a saved block (in async code, such as an async flow, load
        with ``await PostgresLedger.aload("BLOCK_NAME")``):
        ```python
        from prefect_coder.blocks import PostgresLedger

        store = PostgresLedger.load("BLOCK_NAME").get_store()
        ```
    """

    _block_type_name: ClassVar[str] = "Coder Postgres Ledger"
    _block_type_slug: ClassVar[str] = "prefect-coder-postgres-ledger"
    _description: ClassVar[str] = (
        "Where prefect-coder keeps each workflow's checkpoint, journal, finished steps and "
        "tool ledger when workers on several machines share the work: tables in a PostgreSQL "
        "schema, reached through one connection pool per worker process. The DSN holds a "
        "password, so it is kept secret."
    )
    _documentation_url: ClassVar[Any] = DOCS_URL
    _logo_url: ClassVar[Any] = LogoUrl()
    _block_schema_capabilities: ClassVar[list[str]] = ["coder-ledger-store"]

    dsn: SecretStr = Field(
        title="DSN",
        description="PostgreSQL connection string, e.g. postgresql://user:password@host:5432/db.",
    )
    db_schema: str = Field(
        default="prefect_coder",
        title="Schema",
        description="The database schema that holds the store's tables.",
    )

    def get_store(self) -> DurableStore:
        """The store this process shares for this database and schema (one pool per loop).

        Do not close it: every task of the process uses it; it closes when the process exits.
        """
        from coder_chat.durable.postgres import PostgresStore

        dsn = self.dsn.get_secret_value()
        return shared_store(
            ("postgres", dsn, self.db_schema), lambda: PostgresStore(dsn, schema=self.db_schema)
        )
