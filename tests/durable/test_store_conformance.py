"""One contract, two stores: every test with ``backend``/``store`` runs on SQLite and Postgres.

Real files, a real Postgres, real processes (racing claims, a writer SIGKILLed
mid-stream). The tests at the end check what only one backend can get wrong:
SQLite refusing files that are not its own, Postgres refusing a newer or foreign
schema and never showing its password.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import pickle
import signal
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from uuid import uuid4

import asyncpg
import pytest

from coder_chat.durable.postgres import PostgresStore
from coder_chat.durable.records import (
    Fence,
    WorkflowRecord,
    WorkflowState,
    args_digest,
    ledger_key,
)
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.store import SCHEMA_VERSION, DurableStore, FencedOut
from coder_chat.errors import CoderConfigError, CoderStoreError

from .backends import (
    FENCED_WRITES,
    Backend,
    T,
    insert_malformed_workflow,
    installed_versions,
    journal,
    snapshot,
    step_record,
)

# -- round trips ------------------------------------------------------------------------------


async def test_both_stores_implement_the_protocol(store: DurableStore) -> None:
    assert isinstance(store, DurableStore)


async def test_workflow_round_trip(store: DurableStore) -> None:
    assert await store.get_workflow(T, "wf") is None
    fence = await store.begin_run(T, "wf", deployment="prod", flow_run_id="run-1")
    assert fence == Fence(tenant=T, workflow_id="wf", epoch=1)

    record = await store.get_workflow(T, "wf")
    assert record is not None
    assert (record.tenant, record.workflow_id, record.epoch) == (T, "wf", 1)
    assert (record.state, record.deployment, record.flow_run_id) == (
        WorkflowState.RUNNING,
        "prod",
        "run-1",
    )
    assert (record.chat_id, record.last_seen_message_id) == (None, None)
    assert record.heartbeat_at is not None

    await store.save_checkpoint(fence, "chat-1", 41)
    saved = await store.get_workflow(T, "wf")
    assert saved is not None
    assert (saved.chat_id, saved.last_seen_message_id) == ("chat-1", 41)
    assert saved.updated_at >= record.updated_at

    await store.save_checkpoint(fence, "chat-1", None)  # a chat with no message seen yet
    unseen = await store.get_workflow(T, "wf")
    assert unseen is not None
    assert (unseen.chat_id, unseen.last_seen_message_id) == ("chat-1", None)

    await store.heartbeat(fence)
    beaten = await store.get_workflow(T, "wf")
    assert beaten is not None and beaten.heartbeat_at is not None
    assert beaten.heartbeat_at >= record.heartbeat_at

    await store.clear_checkpoint(fence)
    cleared = await store.get_workflow(T, "wf")
    assert cleared is not None
    assert (cleared.chat_id, cleared.last_seen_message_id) == (None, None)

    await store.finish(fence, WorkflowState.FAILED)
    failed = await store.get_workflow(T, "wf")
    assert failed is not None
    assert failed.state is WorkflowState.FAILED
    assert failed.heartbeat_at == beaten.heartbeat_at  # finishing is not a heartbeat
    # What a reader gets back is exactly what was stored, field for field.
    assert WorkflowRecord.model_validate_json(failed.model_dump_json()) == failed


async def test_begin_run_takes_the_next_epoch_and_keeps_the_checkpoint(
    store: DurableStore,
) -> None:
    first = await store.begin_run(T, "wf", deployment="a", flow_run_id="run-1")
    await store.save_checkpoint(first, "chat-1", 7)
    await store.finish(first, WorkflowState.FAILED)

    second = await store.begin_run(T, "wf", deployment="b")
    assert second.epoch == first.epoch + 1 == 2
    record = await store.get_workflow(T, "wf")
    assert record is not None
    assert (record.chat_id, record.last_seen_message_id) == ("chat-1", 7)
    assert (record.state, record.deployment, record.flow_run_id, record.epoch) == (
        WorkflowState.RUNNING,
        "b",
        None,
        2,
    )
    third = await store.begin_run(T, "wf")
    assert third.epoch == 3
    other = await store.begin_run(T, "another")
    assert other.epoch == 1  # epochs are per workflow


async def test_inputs_are_kept_fenced_and_survive_a_new_run(store: DurableStore) -> None:
    """What a workflow was told between turns: written whole, fenced, kept across runs."""
    first = await store.begin_run(T, "wf")
    told = [{"approved": True}, "plain text", 7]
    await store.save_inputs(first, told[:1])
    await store.save_inputs(first, told)
    record = await store.get_workflow(T, "wf")
    assert record is not None and record.inputs == told
    second = await store.begin_run(T, "wf")
    with pytest.raises(FencedOut):
        await store.save_inputs(first, [])
    again = await store.get_workflow(T, "wf")
    assert again is not None and again.inputs == told and again.epoch == second.epoch


async def test_chat_round_trip(store: DurableStore) -> None:
    fence = await store.begin_run(T, "wf")
    assert await store.get_chat(T, "chat-1") is None

    horizon = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    entry = journal("submitting", 1, horizon=horizon)
    await store.write_journal(fence, "chat-1", entry)
    chat = await store.get_chat(T, "chat-1")
    assert chat is not None
    assert (chat.tenant, chat.chat_id, chat.workflow_id) == (T, "chat-1", "wf")
    assert chat.journal == entry and chat.discarded is False

    verdict = journal("cut-short", 2, reason="hard_crash")
    await store.write_journal(fence, "chat-1", verdict)  # replaces the entry
    await store.mark_discarded(fence, "chat-1")
    chat = await store.get_chat(T, "chat-1")
    assert chat is not None
    assert chat.journal == verdict and chat.discarded is True

    await store.mark_discarded(fence, "chat-2")  # a chat known only as discarded
    lone = await store.get_chat(T, "chat-2")
    assert lone is not None
    assert (lone.workflow_id, lone.journal, lone.discarded) == ("wf", None, True)


async def test_ledger_round_trip(store: DurableStore) -> None:
    fence = await store.begin_run(T, "wf")
    digest = args_digest({"amount": 3, "to": "alice"})
    won, entry = await store.claim_tool(
        fence, "chat-1", "call-1", tool_name="charge", marker="step-1", args_digest=digest
    )
    assert won is True
    assert (entry.state, entry.tool_name, entry.marker, entry.args_digest) == (
        "committing",
        "charge",
        "step-1",
        digest,
    )
    assert entry.idempotency_key == ledger_key(T, "chat-1", "call-1") == f"{T}/chat-1/call-1"
    assert await store.get_tool(T, "chat-1", "call-1") == entry

    again, existing = await store.claim_tool(fence, "chat-1", "call-1", tool_name="other")
    assert again is False
    assert existing == entry  # the entry already there, not the one offered

    output = {
        "receipt": "r-1",
        "items": [1, 2.5, -0.0, 10**30, None, True],
        "text": 'héllo ✓ 𝄞 "quoted" \\ \n',
        "nested": {"z": 1, "a": [{}]},
    }
    done = await store.complete_tool(fence, "chat-1", "call-1", output=output)
    assert (done.state, done.output, done.is_error) == ("done", output, False)
    assert done.created_at == entry.created_at
    assert await store.get_tool(T, "chat-1", "call-1") == done

    # A claim after done still loses, and answers with the recorded outcome.
    late, recorded = await store.claim_tool(fence, "chat-1", "call-1", tool_name="charge")
    assert late is False and recorded == done

    await store.claim_tool(fence, "chat-1", "call-0", tool_name="t")
    failed = await store.complete_tool(fence, "chat-1", "call-0", output="boom", is_error=True)
    assert (failed.output, failed.is_error) == ("boom", True)

    with pytest.raises(CoderStoreError, match="no ledger entry") as info:
        await store.complete_tool(fence, "chat-1", "missing", output=1)
    assert not isinstance(info.value, FencedOut)
    assert await store.get_tool(T, "chat-1", "missing") is None


async def test_list_tools_keeps_claim_order(store: DurableStore) -> None:
    fence = await store.begin_run(T, "wf")
    order = ["call-c", "call-a", "call-b", "call-0"]
    for call in order:
        await store.claim_tool(fence, "chat-1", call, tool_name="t")
    await store.claim_tool(fence, "chat-2", "call-z", tool_name="t")
    await store.complete_tool(fence, "chat-1", "call-a", output=None)  # completing keeps its place
    await store.claim_tool(fence, "chat-1", "call-c", tool_name="again")  # a lost claim adds none
    listed = await store.list_tools(T, "chat-1")
    assert [e.tool_call_id for e in listed] == order
    assert [e.state for e in listed] == ["committing", "done", "committing", "committing"]
    assert await store.list_tools(T, "chat-none") == []


# -- fencing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("write", sorted(FENCED_WRITES))
async def test_a_superseded_run_is_fenced_out_of_every_write(
    store: DurableStore, write: str
) -> None:
    old = await store.begin_run(T, "wf")
    await store.save_checkpoint(old, "chat-1", 1)
    await store.write_journal(old, "chat-1", journal())
    await store.claim_tool(old, "chat-1", "call-1", tool_name="t")
    await store.complete_step(old, step_record(old, 1))  # a late one must not replace it
    new = await store.begin_run(T, "wf")
    before = await snapshot(store)

    with pytest.raises(FencedOut) as info:
        await FENCED_WRITES[write](store, old)
    assert (info.value.fence, info.value.current) == (old, 2)
    assert info.value.retryable is False
    assert await snapshot(store) == before  # nothing was written

    await FENCED_WRITES[write](store, new)  # the newest run may


async def test_fences_that_never_held_the_workflow_are_refused(store: DurableStore) -> None:
    await store.begin_run(T, "wf")
    before = await snapshot(store)
    for fence, current in [
        (Fence(tenant=T, workflow_id="never-begun", epoch=1), None),
        (Fence(tenant="org-other", workflow_id="wf", epoch=1), None),
        (Fence(tenant=T, workflow_id="wf", epoch=2), 1),  # a fence from the future
        (Fence(tenant=T, workflow_id="wf", epoch=0), 1),
    ]:
        for name, write in FENCED_WRITES.items():
            with pytest.raises(FencedOut) as info:
                await write(store, fence)
            assert info.value.current == current, name
    assert await snapshot(store) == before


async def test_fenced_out_survives_pickling(store: DurableStore) -> None:
    old = await store.begin_run(T, "wf")
    await store.begin_run(T, "wf")
    with pytest.raises(FencedOut) as info:
        await store.heartbeat(old)
    copy = pickle.loads(pickle.dumps(info.value))
    assert isinstance(copy, FencedOut)
    assert (copy.fence, copy.current, str(copy)) == (old, 2, str(info.value))


# -- tenants ---------------------------------------------------------------------------------


async def test_tenants_never_see_each_other(store: DurableStore) -> None:
    a = await store.begin_run("org-a", "wf", deployment="d")
    b = await store.begin_run("org-b", "wf", deployment="d")
    assert a.epoch == b.epoch == 1
    await store.save_checkpoint(a, "chat", 1)
    await store.save_checkpoint(b, "chat", 2)
    await store.write_journal(a, "chat", journal("submitting", 1))
    await store.mark_discarded(b, "chat")
    won_a, _ = await store.claim_tool(a, "chat", "call", tool_name="a")
    won_b, _ = await store.claim_tool(b, "chat", "call", tool_name="b")
    assert won_a and won_b  # the same ids under two tenants are two keys
    await store.complete_tool(a, "chat", "call", output="a-done")

    wa, wb = await store.get_workflow("org-a", "wf"), await store.get_workflow("org-b", "wf")
    assert wa is not None and wb is not None
    assert (wa.last_seen_message_id, wb.last_seen_message_id) == (1, 2)
    ca, cb = await store.get_chat("org-a", "chat"), await store.get_chat("org-b", "chat")
    assert ca is not None and cb is not None
    assert (ca.journal is not None, ca.discarded) == (True, False)
    assert (cb.journal, cb.discarded) == (None, True)
    la, lb = (
        await store.get_tool("org-a", "chat", "call"),
        await store.get_tool("org-b", "chat", "call"),
    )
    assert la is not None and lb is not None
    assert (la.state, la.tool_name, la.output) == ("done", "a", "a-done")
    assert (lb.state, lb.tool_name, lb.output) == ("committing", "b", None)
    assert la.idempotency_key != lb.idempotency_key

    for tenant in ("org-a", "org-b"):
        assert [w.tenant for w in await store.list_workflows(tenant, deployment="d")] == [tenant]
        assert [c.tenant for c in await store.list_chats(tenant)] == [tenant]
        assert [t.tenant for t in await store.list_tools(tenant, "chat")] == [tenant]
    assert await store.get_workflow("org-c", "wf") is None
    assert await store.list_workflows("org-c") == []

    # A new run under one tenant fences nothing of the other's.
    await store.begin_run("org-a", "wf")
    await store.heartbeat(b)
    with pytest.raises(FencedOut):
        await store.heartbeat(a)


# -- listings --------------------------------------------------------------------------------


async def test_list_workflows_by_deployment_and_state(store: DurableStore) -> None:
    ids = ["b", "B", "a", "_x", "Z9", "é", "10", "9", "a-b", "a_b"]
    fences = {
        wf: await store.begin_run(T, wf, deployment="prod" if i % 2 else "dev")
        for i, wf in enumerate(ids)
    }
    await store.finish(fences["B"], WorkflowState.FINISHED)
    await store.finish(fences["Z9"], WorkflowState.FAILED)
    await store.begin_run("org-other", "a", deployment="prod")

    everything = await store.list_workflows(T)
    assert [w.workflow_id for w in everything] == sorted(ids)  # code-point (byte) order

    prod = [wf for i, wf in enumerate(ids) if i % 2]
    assert [w.workflow_id for w in await store.list_workflows(T, deployment="prod")] == sorted(prod)
    assert await store.list_workflows(T, deployment="nowhere") == []

    done = await store.list_workflows(T, states=[WorkflowState.FINISHED, WorkflowState.FAILED])
    assert [w.workflow_id for w in done] == ["B", "Z9"]
    running = await store.list_workflows(T, deployment="prod", states=[WorkflowState.RUNNING])
    assert [w.workflow_id for w in running] == sorted(set(prod) - {"B", "Z9"})
    # No states (None or empty) means every state.
    assert await store.list_workflows(T, states=[]) == everything


async def test_list_workflows_stale_before(store: DurableStore) -> None:
    fences = [await store.begin_run(T, f"wf-{i}") for i in range(4)]
    await store.heartbeat(fences[2])
    await store.finish(fences[3], WorkflowState.FINISHED)
    records = await store.list_workflows(T)
    beats = sorted({w.heartbeat_at for w in records if w.heartbeat_at is not None})
    assert len(beats) >= 2

    def older_than(cut: datetime) -> list[str]:
        return [w.workflow_id for w in records if w.heartbeat_at and w.heartbeat_at < cut]

    for cut in [beats[0], beats[1], beats[-1], beats[-1] + timedelta(microseconds=1)]:
        listed = await store.list_workflows(T, stale_before=cut)
        assert [w.workflow_id for w in listed] == older_than(cut)
        # The same instant in another zone is the same cut.
        elsewhere = cut.astimezone(timezone(timedelta(hours=-7, minutes=-30)))
        assert await store.list_workflows(T, stale_before=elsewhere) == listed

    assert await store.list_workflows(T, stale_before=beats[0]) == []
    every = await store.list_workflows(T, stale_before=beats[-1] + timedelta(seconds=1))
    assert len(every) == 4  # finished ones too: the state filter is separate
    stale_running = await store.list_workflows(
        T, states=[WorkflowState.RUNNING], stale_before=beats[-1] + timedelta(seconds=1)
    )
    assert [w.workflow_id for w in stale_running] == ["wf-0", "wf-1", "wf-2"]


async def test_list_chats_discarded_or_not(store: DurableStore) -> None:
    fence = await store.begin_run(T, "wf")
    for chat in ["c-3", "c-1", "C-2", "c-0"]:
        await store.write_journal(fence, chat, journal())
    await store.mark_discarded(fence, "c-3")
    await store.mark_discarded(fence, "C-2")
    other = await store.begin_run("org-other", "wf")
    await store.mark_discarded(other, "c-9")

    assert [c.chat_id for c in await store.list_chats(T)] == ["C-2", "c-0", "c-1", "c-3"]
    assert [c.chat_id for c in await store.list_chats(T, discarded=True)] == ["C-2", "c-3"]
    assert [c.chat_id for c in await store.list_chats(T, discarded=False)] == ["c-0", "c-1"]
    assert await store.list_chats("org-none") == []


# -- races -----------------------------------------------------------------------------------


async def test_racing_claims_in_one_process_have_one_winner(backend: Backend) -> None:
    first, second = backend.open(), backend.open()  # two connections (pools), really parallel
    fence = await first.begin_run(T, "wf")
    await second.get_workflow(T, "wf")
    for i in range(40):
        (won_1, entry_1), (won_2, entry_2) = await asyncio.gather(
            first.claim_tool(fence, "race", f"call-{i}", tool_name="first"),
            second.claim_tool(fence, "race", f"call-{i}", tool_name="second"),
        )
        assert won_1 != won_2, i
        assert entry_1 == entry_2  # the loser is handed the winner's entry
        assert entry_1.tool_name == ("first" if won_1 else "second")


async def test_racing_claims_in_two_processes_have_one_winner(backend: Backend) -> None:
    store = backend.open()
    fence = await store.begin_run(T, "wf")
    count = 150
    args = (T, "wf", str(fence.epoch), str(count))
    workers = [backend.worker("claim", *args, name) for name in ("p0", "p1")]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:  # both start at once
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        outputs = [worker.communicate(timeout=60)[0] for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait()
    assert [w.returncode for w in workers] == [0, 0]

    results = [[json.loads(line) for line in out.splitlines()] for out in outputs]
    assert [len(r) for r in results] == [count, count]
    wins = [0, 0]
    for p0, p1 in zip(*results, strict=True):
        assert p0["i"] == p1["i"]
        assert p0["won"] != p1["won"], p0["i"]  # exactly one winner
        assert p0["by"] == p1["by"] == ("p0" if p0["won"] else "p1")
        wins[0 if p0["won"] else 1] += 1
    assert sum(wins) == count
    stored = await store.list_tools(T, "race")
    assert len(stored) == count
    assert {e.tool_call_id: e.tool_name for e in stored} == {
        f"call-{p0['i']}": p0["by"] for p0 in results[0]
    }


async def test_racing_begin_runs_take_distinct_epochs(backend: Backend) -> None:
    first, second = backend.open(), backend.open()
    await asyncio.gather(first.list_workflows(T), second.list_workflows(T))
    for i in range(15):
        a, b = await asyncio.gather(first.begin_run(T, f"wf-{i}"), second.begin_run(T, f"wf-{i}"))
        assert sorted([a.epoch, b.epoch]) == [1, 2]
        record = await first.get_workflow(T, f"wf-{i}")
        assert record is not None and record.epoch == 2


async def test_racing_writes_to_a_new_chat_lose_nothing(backend: Backend) -> None:
    first, second = backend.open(), backend.open()
    fence = await first.begin_run(T, "wf")
    for i in range(15):
        entry = journal("submitting", i + 1)
        await asyncio.gather(
            first.write_journal(fence, f"chat-{i}", entry),
            second.mark_discarded(fence, f"chat-{i}"),
        )
        chat = await second.get_chat(T, f"chat-{i}")
        assert chat is not None
        assert (chat.journal, chat.discarded) == (entry, True)


async def test_concurrent_first_use_migrates_once(backend: Backend) -> None:
    for round_ in range(6):  # each on a fresh file or schema: first use is the race
        fresh = backend.sibling(f"r{round_}")
        stores = [fresh.open() for _ in range(6)]
        fences = await asyncio.gather(*(s.begin_run(T, f"wf-{i}") for i, s in enumerate(stores)))
        assert [f.epoch for f in fences] == [1] * 6
        assert len(await stores[0].list_workflows(T)) == 6
        assert await installed_versions(fresh) == list(range(1, SCHEMA_VERSION + 1))


# -- durability ------------------------------------------------------------------------------


async def test_every_acknowledged_write_survives_a_sigkill(backend: Backend) -> None:
    store = backend.open()
    fence = await store.begin_run(T, "wf")
    worker = backend.worker("write", T, "wf", str(fence.epoch))
    acknowledged = -1
    try:
        assert worker.stdout is not None
        while acknowledged < 10:
            line = worker.stdout.readline()
            assert line.startswith("written "), line
            acknowledged = int(line.split()[1])
        worker.send_signal(signal.SIGKILL)  # mid-stream: no finally, no close
        worker.wait(timeout=30)
        # From the same reader: its buffer may hold lines readline() read ahead, which
        # communicate() (reading the pipe itself) would never see.
        rest = worker.stdout.read()
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
    assert worker.returncode == -signal.SIGKILL
    for line in rest.splitlines():  # what it said before dying counts too
        acknowledged = int(line.split()[1])

    reopened = backend.open()
    record = await reopened.get_workflow(T, "wf")
    assert record is not None and record.chat_id == "chat-w"
    assert record.last_seen_message_id is not None
    assert record.last_seen_message_id >= acknowledged
    entries = {e.tool_call_id: e for e in await reopened.list_tools(T, "chat-w")}
    for n in range(acknowledged + 1):
        entry = entries[f"call-{n}"]
        assert (entry.state, entry.output) == ("done", {"n": n})
    # At most the one write in flight is past the last acknowledgement, whole or absent.
    assert len(entries) <= acknowledged + 2

    # The store is healthy: the next run takes over and fences the dead one out.
    nxt = await reopened.begin_run(T, "wf")
    assert nxt.epoch == 2
    with pytest.raises(FencedOut):
        await reopened.save_checkpoint(fence, "chat-w", 0)


# -- event loops and lifecycle ---------------------------------------------------------------


async def count_connections(dsn: str, application_name: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        value = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", application_name
        )
        return int(value)
    finally:
        await conn.close()


async def until_connections(dsn: str, application_name: str, expected: int) -> None:
    """Wait (bounded) for the server to see ``expected`` connections: a close is async there."""
    for _ in range(200):
        if await count_connections(dsn, application_name) == expected:
            return
        await asyncio.sleep(0.05)
    assert await count_connections(dsn, application_name) == expected


async def test_usable_from_other_event_loops(backend: Backend) -> None:
    app = f"pc-loops-{uuid4().hex[:12]}"
    store = backend.open(application_name=app) if backend.is_postgres else backend.open()

    async def work(workflow_id: str) -> WorkflowRecord | None:
        fence = await store.begin_run(T, workflow_id)
        await store.save_checkpoint(fence, f"chat-{workflow_id}", 3)
        await store.claim_tool(fence, f"chat-{workflow_id}", "call", tool_name="t")
        return await store.get_workflow(T, workflow_id)

    def on_a_new_loop(workflow_id: str) -> WorkflowRecord | None:
        return asyncio.run(work(workflow_id))  # like a Prefect task run on its own loop

    a, b = await asyncio.gather(
        asyncio.to_thread(on_a_new_loop, "wf-a"), asyncio.to_thread(on_a_new_loop, "wf-b")
    )
    assert a is not None and b is not None
    assert (a.last_seen_message_id, b.last_seen_message_id) == (3, 3)
    if backend.is_postgres:
        await until_connections(backend.dsn, app, 0)  # each pool closed with its loop

    # And here, on this loop, after those loops are gone.
    assert [w.workflow_id for w in await store.list_workflows(T)] == ["wf-a", "wf-b"]
    record = await work("wf-c")
    assert record is not None and record.epoch == 1


async def test_close_reaches_a_loop_still_running_elsewhere(backend: Backend) -> None:
    app = f"pc-close-{uuid4().hex[:12]}"
    store = backend.open(application_name=app) if backend.is_postgres else backend.open()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def there(coro: Coroutine[Any, Any, Any]) -> Awaitable[Any]:
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    try:
        fence = await there(store.begin_run(T, "wf"))
        await store.heartbeat(fence)  # and here: one pool per loop
        if backend.is_postgres:
            assert await count_connections(backend.dsn, app) >= 2
        await store.close()
        if backend.is_postgres:
            await until_connections(backend.dsn, app, 0)
        with pytest.raises(CoderStoreError, match="closed"):
            await there(store.get_workflow(T, "wf"))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join)
        loop.close()


async def test_a_closed_store_says_so(backend: Backend) -> None:
    store = backend.open()
    fence = await store.begin_run(T, "wf")
    await store.close()
    await store.close()  # twice is fine
    with pytest.raises(CoderStoreError, match="closed"):
        await store.get_workflow(T, "wf")
    with pytest.raises(CoderStoreError, match="closed"):
        await store.heartbeat(fence)
    record = await backend.open().get_workflow(T, "wf")  # the data is still there
    assert record is not None and record.epoch == 1


# -- malformed rows --------------------------------------------------------------------------


async def test_malformed_rows_are_reported_not_skipped(backend: Backend) -> None:
    store = backend.open()
    fence = await store.begin_run(T, "good")
    await store.write_journal(fence, "chat-good", journal())
    await store.claim_tool(fence, "chat-good", "call-good", tool_name="t")
    await insert_malformed_workflow(backend, T)
    await backend.execute(
        "INSERT INTO chats (tenant, chat_id, workflow_id, discarded, body) "
        "VALUES (?, 'chat-bad', 'good', 0, ?)",
        "INSERT INTO {s}.chats (tenant, chat_id, workflow_id, discarded, body) "
        "VALUES ($1, 'chat-bad', 'good', false, $2::jsonb)",
        T,
        '{"tenant": "org-1", "chat_id": ["not", "a", "string"], "workflow_id": "good"}',
    )
    await backend.execute(
        "INSERT INTO ledger (tenant, chat_id, tool_call_id, state, body) "
        "VALUES (?, 'chat-good', 'call-bad', 'committing', ?)",
        "INSERT INTO {s}.ledger (tenant, chat_id, tool_call_id, state, body) "
        "VALUES ($1, 'chat-good', 'call-bad', 'committing', $2::jsonb)",
        T,
        '{"state": "weird"}',
    )

    reads: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("workflows", lambda: store.get_workflow(T, "bad")),
        ("workflows", lambda: store.list_workflows(T)),
        ("workflows", lambda: store.begin_run(T, "bad")),
        ("workflows", lambda: store.heartbeat(Fence(tenant=T, workflow_id="bad", epoch=1))),
        ("chats", lambda: store.get_chat(T, "chat-bad")),
        ("chats", lambda: store.list_chats(T)),
        ("chats", lambda: store.write_journal(fence, "chat-bad", journal())),
        ("ledger", lambda: store.get_tool(T, "chat-good", "call-bad")),
        ("ledger", lambda: store.list_tools(T, "chat-good")),
        ("ledger", lambda: store.claim_tool(fence, "chat-good", "call-bad", tool_name="t")),
        ("ledger", lambda: store.complete_tool(fence, "chat-good", "call-bad", output=1)),
    ]
    for table, read in reads:
        with pytest.raises(CoderStoreError, match=f"malformed row in {table}") as info:
            await read()
        assert not isinstance(info.value, FencedOut)
        assert info.value.retryable is False

    # The good rows are untouched and still readable one by one.
    assert await store.get_workflow(T, "good") is not None
    assert await store.get_chat(T, "chat-good") is not None
    assert await store.get_tool(T, "chat-good", "call-good") is not None


async def test_a_nul_character_in_a_value(backend: Backend) -> None:
    """SQLite keeps it; Postgres JSONB cannot: a clear error, and the entry stays as it was."""
    store = backend.open()
    fence = await store.begin_run(T, "wf")
    _, entry = await store.claim_tool(fence, "chat", "call", tool_name="t")
    output = {"bytes": "a\x00b"}
    if backend.is_postgres:
        with pytest.raises(CoderStoreError, match="complete_tool failed") as info:
            await store.complete_tool(fence, "chat", "call", output=output)
        assert info.value.retryable is False
        assert await store.get_tool(T, "chat", "call") == entry
    else:
        done = await store.complete_tool(fence, "chat", "call", output=output)
        assert await store.get_tool(T, "chat", "call") == done


# -- SQLite only: files that are not ours ----------------------------------------------------


def listing(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in path.parent.iterdir()}


async def assert_refused(path: Path, match: str) -> None:
    before = listing(path)
    store = SqliteStore(path)
    try:
        for _ in range(2):  # and again: a refusal is not cached into acceptance
            with pytest.raises(CoderStoreError, match=match):
                await store.get_workflow(T, "wf")
        with pytest.raises(CoderStoreError, match=match):
            await store.begin_run(T, "wf")
    finally:
        await store.close()
    assert listing(path) == before  # same files, same bytes


async def test_sqlite_refuses_a_file_that_is_not_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    await assert_refused(path, "not a usable SQLite database")


async def test_sqlite_refuses_another_programs_database(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers (name) VALUES ('ada')")
    conn.close()
    await assert_refused(path, "belongs to another program")


async def test_sqlite_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = SqliteStore(path)
    fence = await store.begin_run(T, "wf")
    await store.save_checkpoint(fence, "chat", 1)
    await store.close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    await assert_refused(path, f"schema version {SCHEMA_VERSION + 1}, newer")


async def test_sqlite_takes_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    store = SqliteStore(path)
    try:
        assert (await store.begin_run(T, "wf")).epoch == 1
    finally:
        await store.close()


# -- Postgres only ---------------------------------------------------------------------------


async def schema_snapshot(dsn: str, schema: str) -> list[object]:
    conn = await asyncpg.connect(dsn)
    try:
        columns = await conn.fetch(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = $1 ORDER BY table_name, column_name",
            schema,
        )
        objects = await conn.fetch(
            "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = $1 ORDER BY c.relname",
            schema,
        )
        rows: list[object] = []
        for (table,) in await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 "
            "ORDER BY table_name",
            schema,
        ):
            rows.append(
                [
                    tuple(r)
                    for r in await conn.fetch(f'SELECT * FROM "{schema}"."{table}" ORDER BY 1, 2')
                ]
            )
        return [[tuple(c) for c in columns], [tuple(o) for o in objects], rows]
    finally:
        await conn.close()


async def test_postgres_refuses_a_newer_schema_and_changes_nothing(pg: Backend) -> None:
    store = pg.open()
    fence = await store.begin_run(T, "wf")
    await store.save_checkpoint(fence, "chat", 1)
    await store.close()
    await pg.execute("", "INSERT INTO {s}.migrations (version) VALUES ($1)", SCHEMA_VERSION + 1)
    before = await schema_snapshot(pg.dsn, pg.location)

    newer = pg.open()
    for attempt in (lambda: newer.get_workflow(T, "wf"), lambda: newer.begin_run(T, "wf")):
        with pytest.raises(CoderStoreError, match="newer than this prefect-coder") as info:
            await attempt()
        assert f"schema version {SCHEMA_VERSION + 1}" in str(info.value)
        assert info.value.retryable is False
    assert await schema_snapshot(pg.dsn, pg.location) == before


async def test_postgres_refuses_a_schema_it_did_not_create(pg: Backend) -> None:
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute(f'CREATE SCHEMA "{pg.location}"')
        await conn.execute(f'CREATE TABLE "{pg.location}".customers (id int, name text)')
        await conn.execute(f"INSERT INTO \"{pg.location}\".customers VALUES (1, 'ada')")
    finally:
        await conn.close()
    before = await schema_snapshot(pg.dsn, pg.location)
    store = pg.open()
    with pytest.raises(CoderStoreError, match="did not create") as info:
        await store.list_workflows(T)
    assert pg.location in str(info.value)
    assert await schema_snapshot(pg.dsn, pg.location) == before


async def test_postgres_connection_killed_mid_write_is_a_retryable_store_error(
    pg: Backend,
) -> None:
    app = f"pc-kill-{uuid4().hex[:12]}"
    store = pg.open(application_name=app)
    fence = await store.begin_run(T, "wf")
    holder, watcher = await asyncpg.connect(pg.dsn), await asyncpg.connect(pg.dsn)
    try:
        lock = holder.transaction()
        await lock.start()
        await holder.execute(
            f'SELECT 1 FROM "{pg.location}".workflows WHERE tenant = $1 FOR UPDATE', T
        )
        write = asyncio.create_task(store.save_checkpoint(fence, "chat", 1))
        killed = False
        for _ in range(200):  # until the store's write waits on our lock, then kill it
            killed = bool(
                await watcher.fetchval(
                    "SELECT bool_or(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = $1 AND wait_event_type = 'Lock'",
                    app,
                )
            )
            if killed:
                break
            await asyncio.sleep(0.02)
        assert killed
        with pytest.raises(CoderStoreError) as info:
            await write
        assert info.value.retryable is True
        assert "save_checkpoint failed" in str(info.value)
        assert not isinstance(info.value, FencedOut)
        await lock.rollback()
    finally:
        await holder.close()
        await watcher.close()

    for _ in range(3):  # what a caller does with a retryable error
        try:
            await store.save_checkpoint(fence, "chat", 2)
            break
        except CoderStoreError as exc:
            assert exc.retryable
    record = await store.get_workflow(T, "wf")
    assert record is not None and record.last_seen_message_id == 2


def with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, ""))


async def test_postgres_missing_database_is_named_and_not_retryable(postgres_dsn: str) -> None:
    store = PostgresStore(with_database(postgres_dsn, "prefect_coder_no_such_db"))
    try:
        with pytest.raises(CoderStoreError, match="prefect_coder_no_such_db") as info:
            await store.get_workflow(T, "wf")
        assert info.value.retryable is False
    finally:
        await store.close()


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:secretpw@127.0.0.1:5499/db",
        "postgres://u@127.0.0.1:5499/db?password=secretpw&sslmode=disable",
        "postgresql://u:secret%40pw@127.0.0.1:5499/db",
    ],
)
async def test_unreachable_postgres_names_the_server_never_the_password(dsn: str) -> None:
    store = PostgresStore(dsn, connect_timeout=5)
    secrets = ("secretpw", "secret@pw", "secret%40pw")
    try:
        assert not any(s in repr(store) or s in str(store) for s in secrets)
        with pytest.raises(CoderStoreError) as info:
            await store.begin_run(T, "wf")
        error = info.value
        for text in (str(error), repr(error)):
            assert "127.0.0.1" in text and "5499" in text and "'db'" in text
            assert not any(s in text for s in secrets)
        assert error.retryable is True
        chained: BaseException | None = error
        while chained is not None:  # nor anywhere down the chain
            assert not any(s in f"{chained!s}{chained!r}" for s in secrets)
            chained = chained.__cause__ or chained.__context__
        assert not isinstance(error, OSError | asyncpg.PostgresError)
    finally:
        await store.close()


def test_postgres_bad_arguments_are_refused_at_once() -> None:
    with pytest.raises(CoderConfigError, match="postgresql://") as info:
        PostgresStore("mysql://u:secretpw@127.0.0.1/db")
    assert "secretpw" not in str(info.value)
    with pytest.raises(CoderConfigError, match="schema name"):
        PostgresStore("postgresql://127.0.0.1/db", schema='x"; DROP TABLE y; --')
    with pytest.raises(CoderConfigError, match="pool sizes"):
        PostgresStore("postgresql://127.0.0.1/db", min_size=5, max_size=2)
