"""The Postgres store under a role of its own that owns its schema and nothing more.

An administrator makes the schema for the role (``CREATE SCHEMA … AUTHORIZATION …``); the
role has no right to create schemas in the database (PostgreSQL grants none by default).
The store must work there, and where no schema was made for it, say what to do.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from coder_chat.durable.postgres import PostgresStore
from coder_chat.durable.records import WorkflowState
from coder_chat.errors import CoderStoreError


def as_role(dsn: str, role: str, password: str) -> str:
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}:{password}@{host}"))


@pytest.fixture
async def role(postgres_dsn: str) -> AsyncIterator[tuple[str, str]]:
    """A login role with no right beyond logging in: its name and its own DSN."""
    name, password = f"pc_role_{secrets.token_hex(4)}", secrets.token_urlsafe(12)
    admin = await asyncpg.connect(postgres_dsn)
    try:
        await admin.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
        yield name, as_role(postgres_dsn, name, password)
        await admin.execute(f"DROP OWNED BY {name} CASCADE")
        await admin.execute(f"DROP ROLE {name}")
    finally:
        await admin.close()


async def test_a_role_owning_the_schema_made_for_it_runs_the_store(
    postgres_dsn: str, role: tuple[str, str]
) -> None:
    name, dsn = role
    admin = await asyncpg.connect(postgres_dsn)
    try:
        await admin.execute(f"CREATE SCHEMA {name} AUTHORIZATION {name}")
        may_create = await admin.fetchval(
            "SELECT has_database_privilege($1, current_database(), 'CREATE')", name
        )
    finally:
        await admin.close()
    assert not may_create
    store = PostgresStore(dsn, schema=name)
    try:
        fence = await store.begin_run("t", "wf", flow_run_id="run-1")
        await store.finish(fence, WorkflowState.FINISHED)
        record = await store.get_workflow("t", "wf")
    finally:
        await store.close()
    assert record is not None and record.state == WorkflowState.FINISHED


async def test_a_role_with_no_schema_of_its_own_is_told_what_to_ask_for(
    role: tuple[str, str],
) -> None:
    name, dsn = role
    store = PostgresStore(dsn, schema=f"{name}_missing")
    try:
        with pytest.raises(CoderStoreError) as caught:
            await store.begin_run("t", "wf", flow_run_id="run-1")
    finally:
        await store.close()
    message = str(caught.value)
    assert f"CREATE SCHEMA {name}_missing AUTHORIZATION {name}" in message
    assert dsn.split(":")[2].split("@")[0] not in message  # never the password
