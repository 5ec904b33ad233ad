"""Postgres: round trips per store call, and the races a one-statement write must still win.

Round trips are counted by a real peer, a TCP proxy between the store and the server
(``tests/pgproxy.py``), on a store with one pooled connection, after a warm-up so that
asyncpg's prepared statements are cached (a statement's first use costs one more trip to
prepare it). Each fenced write is one statement, its own transaction: one round trip, no
``BEGIN``/``COMMIT`` and no reset query when the connection goes back to the pool; only a
refused write looks again to say why. The reads a step makes before acting are one call.

The races: a write that waits behind a ``begin_run`` in progress is judged against the
epoch that run takes, and a claim that waits behind a racing claim is handed the winner's
entry although it was committed after the waiting statement began.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from uuid import uuid4

import asyncpg
import pytest

from coder_chat.durable.postgres import PostgresStore
from coder_chat.durable.records import Fence, LedgerEntry, WorkflowState
from coder_chat.durable.store import DurableStore, FencedOut

from ..pgproxy import RoundTripProxy
from .backends import FENCED_WRITES, Backend, journal, snapshot, step_record

T = "org-1"
WARMUP = 3

Call = Callable[[int], Awaitable[object]]


@pytest.fixture
async def proxied(pg: Backend) -> AsyncIterator[tuple[RoundTripProxy, PostgresStore]]:
    """A store on ``pg``'s schema whose one connection goes through a counting proxy."""
    async with RoundTripProxy(pg.dsn) as proxy:
        store = PostgresStore(proxy.dsn, schema=pg.location, min_size=1, max_size=1)
        pg.stores.append(store)
        try:
            yield proxy, store
        finally:
            await store.close()  # while the proxy still forwards its goodbye


async def round_trips(proxy: RoundTripProxy, call: Call) -> int:
    """Round trips of one call, after ``WARMUP`` calls of the same statement."""
    for i in range(WARMUP):
        await call(-1 - i)
    before = proxy.round_trips
    await call(0)
    return proxy.round_trips - before


def writes(store: DurableStore, fence: Fence) -> dict[str, Call]:
    """Every durable write, repeatable: ``i`` makes each call's key or value its own."""
    return {
        "begin_run": lambda i: store.begin_run(T, "wf-other", deployment="d"),
        "save_checkpoint": lambda i: store.save_checkpoint(fence, "chat-1", i),
        "clear_checkpoint": lambda i: store.clear_checkpoint(fence),
        "heartbeat": lambda i: store.heartbeat(fence),
        "finish": lambda i: store.finish(fence, WorkflowState.FINISHED),
        "complete_step": lambda i: store.complete_step(fence, step_record(fence, 1)),
        "write_journal": lambda i: store.write_journal(fence, "chat-1", journal("resumed", 2)),
        "mark_discarded": lambda i: store.mark_discarded(fence, f"chat-{i}"),
        "claim_tool (won)": lambda i: store.claim_tool(
            fence, "chat-1", f"call-{uuid4().hex}", tool_name="t"
        ),
        "claim_tool (lost)": lambda i: store.claim_tool(fence, "chat-1", "call-0", tool_name="t"),
        "complete_tool": lambda i: store.complete_tool(fence, "chat-1", "call-0", output=i),
    }


async def with_a_claimed_call(store: PostgresStore) -> Fence:
    """A run of workflow ``wf`` that claimed ``call-0`` on ``chat-1`` (the writes' target)."""
    fence = await store.begin_run(T, "wf")
    await store.claim_tool(fence, "chat-1", "call-0", tool_name="t")
    return fence


async def test_every_durable_write_is_one_round_trip(
    proxied: tuple[RoundTripProxy, PostgresStore],
) -> None:
    proxy, store = proxied
    fence = await with_a_claimed_call(store)
    for name, write in writes(store, fence).items():
        commits = store.commits
        assert await round_trips(proxy, write) == 1, name
        assert store.commits == commits + WARMUP + 1, name  # one commit a call


async def test_a_step_reads_in_one_round_trip_what_took_four(
    proxied: tuple[RoundTripProxy, PostgresStore],
) -> None:
    proxy, store = proxied
    fence = await store.begin_run(T, "wf")
    await store.complete_step(fence, step_record(fence, 1, chat_id="chat-1"))
    entry = journal("submitting", 2)
    await store.write_journal(fence, "chat-1", entry)

    view = await store.get_step_view(T, "wf", 2)
    assert (view.previous_chat_id, view.journal) == ("chat-1", entry)
    assert await round_trips(proxy, lambda i: store.get_step_view(T, "wf", 2)) == 1

    replaced: list[Call] = [  # what run_step read before: each is one round trip now
        lambda i: store.get_step(T, "wf", 2),
        lambda i: store.get_workflow(T, "wf"),
        lambda i: store.get_chat(T, "chat-1"),
        lambda i: store.get_step(T, "wf", 1),
    ]
    assert [await round_trips(proxy, read) for read in replaced] == [1, 1, 1, 1]


async def test_only_a_refused_write_looks_again(
    proxied: tuple[RoundTripProxy, PostgresStore],
) -> None:
    proxy, store = proxied
    old = await with_a_claimed_call(store)
    await store.begin_run(T, "wf")  # a newer run: ``old`` is fenced out
    for name, write in writes(store, old).items():
        if name == "begin_run":
            continue

        async def refused(i: int, write: Call = write) -> None:
            with pytest.raises(FencedOut) as info:
                await write(i)
            assert info.value.current == 2

        assert await round_trips(proxy, refused) == 2, name  # the write, then the second look


# -- races a single statement must still win ------------------------------------------------


async def wait_until_blocked(
    watcher: asyncpg.Connection, app: str, write: asyncio.Task[object]
) -> None:
    """Until the store's statement waits on a row lock (it must: never finish first)."""
    for _ in range(500):
        assert not write.done(), "the write finished without waiting for the row's lock"
        waiting = await watcher.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = $1 AND wait_event_type = 'Lock'",
            app,
        )
        if waiting:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the write never waited for the row's lock")


@pytest.mark.parametrize("write", sorted(FENCED_WRITES))
async def test_a_write_waiting_on_a_new_run_is_fenced_out_when_it_commits(
    pg: Backend, write: str
) -> None:
    app = f"pc-race-{uuid4().hex[:12]}"
    store = pg.open(application_name=app)
    old = await store.begin_run(T, "wf")
    await store.save_checkpoint(old, "chat-1", 1)
    await store.write_journal(old, "chat-1", journal())
    await store.claim_tool(old, "chat-1", "call-1", tool_name="t")
    await store.complete_step(old, step_record(old, 1))
    before = await snapshot(store)

    new_run, watcher = await asyncpg.connect(pg.dsn), await asyncpg.connect(pg.dsn)
    try:
        taking = new_run.transaction()  # a begin_run in progress: epoch 2, not yet committed
        await taking.start()
        await new_run.execute(
            f'UPDATE "{pg.location}".workflows SET epoch = 2, '
            "body = jsonb_set(body, '{epoch}', '2') WHERE tenant = $1 AND workflow_id = 'wf'",
            T,
        )
        task: asyncio.Task[object] = asyncio.ensure_future(FENCED_WRITES[write](store, old))
        await wait_until_blocked(watcher, app, task)
        await taking.commit()
        with pytest.raises(FencedOut) as info:
            await task
        assert (info.value.fence, info.value.current) == (old, 2)
    finally:
        await new_run.close()
        await watcher.close()
    after = await snapshot(store)
    workflows = after[0]
    assert isinstance(workflows, list) and [w.epoch for w in workflows] == [2]
    assert after[1:] == before[1:]  # no chat, tool or step written


async def test_a_claim_waiting_on_a_racing_claim_is_handed_the_winners_entry(pg: Backend) -> None:
    app = f"pc-claim-{uuid4().hex[:12]}"
    store = pg.open(application_name=app)
    fence = await store.begin_run(T, "wf")
    winner = LedgerEntry(tenant=T, chat_id="chat-1", tool_call_id="call-1", tool_name="winner")

    racer, watcher = await asyncpg.connect(pg.dsn), await asyncpg.connect(pg.dsn)
    try:
        claiming = racer.transaction()
        await claiming.start()
        await racer.execute(
            f'INSERT INTO "{pg.location}".ledger (tenant, chat_id, tool_call_id, state, body) '
            "VALUES ($1, 'chat-1', 'call-1', 'committing', $2::jsonb)",
            T,
            winner.model_dump_json(),
        )
        task: asyncio.Task[object] = asyncio.ensure_future(
            store.claim_tool(fence, "chat-1", "call-1", tool_name="loser")
        )
        await wait_until_blocked(watcher, app, task)
        await claiming.commit()  # after the waiting claim's snapshot was taken
        assert await task == (False, winner)
    finally:
        await racer.close()
        await watcher.close()
    assert await store.list_tools(T, "chat-1") == [winner]
