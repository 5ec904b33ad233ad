"""Configuration read from the environment, in one place (library code never reads ``os.environ``).

=========================  =============================================
``CODER_URL``              base URL of the Coder deployment
``CODER_SESSION_TOKEN``    session token (kept as a secret)
``CODER_ORG_ID``           organization the chats belong to
``PREFECT_CODER_SQLITE_PATH``  the embedded store's file (default below)
``PREFECT_CODER_POSTGRES_DSN`` a Postgres store's DSN (kept as a secret), for
                           ``prefect-coder workflows … --postgres``
=========================  =============================================
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Where the embedded SQLite store lives unless told otherwise.
DEFAULT_SQLITE_PATH = Path("~/.prefect-coder/ledger.sqlite3")


class CoderSettings(BaseSettings):
    """The Coder connection and the embedded store's path, from the environment."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    url: str | None = Field(default=None, validation_alias=AliasChoices("CODER_URL", "url"))
    session_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("CODER_SESSION_TOKEN", "session_token")
    )
    organization_id: str | None = Field(
        default=None, validation_alias=AliasChoices("CODER_ORG_ID", "organization_id")
    )
    sqlite_path: Path = Field(
        default=DEFAULT_SQLITE_PATH,
        validation_alias=AliasChoices("PREFECT_CODER_SQLITE_PATH", "sqlite_path"),
    )
    #: Read by the command line only (a flow's Postgres store is its PostgresLedger block):
    #: a DSN holds a password, so it never travels on a command line.
    postgres_dsn: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("PREFECT_CODER_POSTGRES_DSN", "postgres_dsn"),
    )
