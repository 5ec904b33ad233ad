"""The Postgres store across server restarts and outages, on a private server (PgCluster).

A restart kills every pooled connection. The next operation finds its connection dead
before anything ran, and the store runs it once more on a fresh one: the caller sees no
error. While the server is down, operations fail with a retryable ``CoderStoreError``
that names the server and never the password; once it is back they succeed again.

The server is restarted from the test's own thread, blocking the event loop, so the
store cannot notice the dead connections before it uses them (as when a restart
happens between two operations of a busy worker).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from uuid import uuid4

import pytest

from coder_chat.durable.postgres import PostgresStore
from coder_chat.durable.store import DurableStore
from coder_chat.errors import CoderStoreError

from ..pgcluster import PgCluster, PgClusterUnavailable
from .backends import REQUIRE_ENV, step_record

T = "org-1"
PASSWORD = "s3cret-pw"  # the private server trusts every local login and ignores it


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    try:
        server = PgCluster().start()
    except PgClusterUnavailable as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"no private Postgres server: {exc}")
        pytest.skip(f"no private Postgres server: {exc}")
    try:
        yield server
    finally:
        server.destroy()


def password_dsn(cluster: PgCluster) -> str:
    return cluster.dsn.replace("postgres@", f"postgres:{PASSWORD}@")


@pytest.fixture
async def store(cluster: PgCluster) -> AsyncIterator[PostgresStore]:
    """A store with a password in its DSN, on a fresh schema, with several pooled connections."""
    if not (cluster.data / "postmaster.pid").exists():  # a test that stopped it and failed
        cluster.start()
    opened = PostgresStore(
        password_dsn(cluster), schema=f"restart_{uuid4().hex[:16]}", min_size=4, max_size=4
    )
    try:
        yield opened
    finally:
        await opened.close()


async def test_operations_after_a_restart_succeed_without_a_retry(
    cluster: PgCluster, store: PostgresStore
) -> None:
    fence = await store.begin_run(T, "wf")
    await store.save_checkpoint(fence, "chat-1", 0)
    for n in range(1, 4):
        commits = store.commits
        cluster.restart()
        await store.save_checkpoint(fence, "chat-1", n)  # a write first
        assert store.commits == commits + 1  # committed once, counted once
        cluster.restart()
        record = await store.get_workflow(T, "wf")  # a read first
        assert record is not None and record.last_seen_message_id == n
        cluster.restart()
        won, _ = await store.claim_tool(fence, "chat-1", f"call-{n}", tool_name="t")
        assert won
        cluster.restart()
        await store.complete_step(fence, step_record(fence, n))
    assert [s.step for s in await store.list_steps(T, "wf")] == [1, 2, 3]


async def test_a_restart_under_concurrent_operations(
    cluster: PgCluster, store: PostgresStore
) -> None:
    fences = [await store.begin_run(T, f"wf-{i}") for i in range(4)]
    # Every pooled connection in use at once, so every one of them is dead after the restart.
    await asyncio.gather(*(store.heartbeat(f) for f in fences))
    for n in range(3):
        cluster.restart()
        commits = store.commits
        await asyncio.gather(*(store.save_checkpoint(f, "chat", n) for f in fences))
        assert store.commits == commits + len(fences)
    records = await store.list_workflows(T)
    assert [r.last_seen_message_id for r in records] == [2] * len(fences)


def assert_names_the_server_not_the_password(error: CoderStoreError, port: int) -> None:
    for text in (str(error), repr(error)):
        assert f"127.0.0.1:{port}" in text and "postgres" in text
        assert PASSWORD not in text
    chained: BaseException | None = error
    while chained is not None:
        assert PASSWORD not in f"{chained!s}{chained!r}"
        chained = chained.__cause__ or chained.__context__


async def test_a_stopped_server_fails_retryably_then_works_again(
    cluster: PgCluster, store: PostgresStore
) -> None:
    fence = await store.begin_run(T, "wf")
    calls: list[Callable[[DurableStore], Awaitable[object]]] = [
        lambda s: s.get_workflow(T, "wf"),
        lambda s: s.save_checkpoint(fence, "chat", 1),
        lambda s: s.claim_tool(fence, "chat", "call", tool_name="t"),
        lambda s: s.list_steps(T, "wf"),
    ]
    never_connected = PostgresStore(password_dsn(cluster), schema=store.schema)
    cluster.stop()
    try:
        for target in (store, never_connected):
            for call in calls:
                with pytest.raises(CoderStoreError) as info:
                    await call(target)
                assert info.value.retryable is True
                assert_names_the_server_not_the_password(info.value, cluster.port)
        assert store.commits == 1  # the begin_run
    finally:
        cluster.start()
    try:
        for target in (store, never_connected):
            for call in calls:
                await call(target)
    finally:
        await never_connected.close()
    assert store.commits == 3
