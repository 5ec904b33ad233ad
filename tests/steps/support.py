"""What the step tests share: a charge tool that counts its calls, short timings, and the
``store`` fixture (an SQLite store of the test's own; the step and sweep conftests offer it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest

from coder_chat import ChatClient
from coder_chat.client.options import ChatOptions
from coder_chat.durable.context import DurableOptions, StepContext, StepTools
from coder_chat.durable.markers import chat_labels, step_marker
from coder_chat.durable.records import Fence, JournalEntry, utcnow
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.step import StepResult, StepSpec, run_step
from coder_chat.durable.store import DurableStore
from coder_chat.durable.tools import durable_tool
from coder_chat.protocol.models import ChatMessage
from coder_chat.simulator import Simulator
from tests.simulator.wire import Wire

CHARGES: list[tuple[int, str]] = []


@durable_tool
async def charge_card(amount_cents: int, idempotency_key: str) -> str:
    """Charge the customer's card."""
    CHARGES.append((amount_cents, idempotency_key))
    return f"receipt-{len(CHARGES)}"


FAST = DurableOptions(
    chat=ChatOptions(request_timeout=10, redial_initial=0.01), step_deadline=30, poll_interval=0.02
)


@pytest.fixture(name="store")
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    """An SQLite store in the test's own folder, closed after it."""
    store = SqliteStore(tmp_path / "ledger.db")
    yield store
    await store.close()


async def step_chat(wire: Wire, ctx: StepContext, tools: StepTools, prompt: str) -> str:
    """A chat made the way the step makes its own (its marker before ``prompt``, its
    labels, its tools declared), as a run that died after sending it leaves it."""
    labels = chat_labels(ctx.workflow_id, ctx.step, "local", await ctx.store.store_id())
    declared = [
        t.declaration().model_dump(exclude_none=True) for t in tools.for_session(ctx.binding)
    ]
    created = await wire.create(
        f"{ctx.marker} {prompt}", labels=labels, unsafe_dynamic_tools=declared
    )
    return str(created["id"])


async def paused_step_one(sim: Simulator, wire: Wire, ctx: StepContext, prompt: str) -> str:
    """Step 1's chat, checkpointed and paused on its client tools, as a run that died
    there leaves it (``prompt`` calls them)."""
    chat_id = await step_chat(wire, ctx, ctx.tools, prompt)
    await ctx.store.save_checkpoint(ctx.fence, chat_id, None)
    await sim.wait_for_status(chat_id, "requires_action")
    return chat_id


#: Step 2's prompt: its answer comes after a while, long enough to be cut.
SLOW = "think it over /sleep 3"


async def step_one_then_two_sent(
    sim: Simulator, client: ChatClient, store: SqliteStore, fence: Fence, wf: str
) -> str:
    """Step 1 finished; step 2 journaled and sent, as its run does, and running."""
    first = await run_step(
        StepContext.fenced(client, store, fence, wf, 1, StepTools(), FAST),
        StepSpec(prompt="plan it"),
    )
    marker = step_marker(wf, 2)
    horizon = utcnow() + timedelta(seconds=10)
    entry = JournalEntry(state="submitting", marker=marker, attempt=0, horizon=horizon)
    await store.write_journal(fence, first.chat_id, entry)
    await client.send_message(first.chat_id, f"{marker} {SLOW}")
    await sim.wait_for_status(first.chat_id, "running")
    return first.chat_id


async def step_two_again(
    client: ChatClient, store: DurableStore, tenant: str, wf: str, chat_id: str
) -> StepResult:
    """A resume or a relaunch: a new run takes the workflow, reopens its chat (when
    archived), runs step 2."""
    resumed = await store.begin_run(tenant, wf)
    if (await client.get_chat(chat_id)).archived:
        await client.update_chat(chat_id, archived=False)
    again = StepContext.fenced(client, store, resumed, wf, 2, StepTools(), FAST)
    return await run_step(again, StepSpec(prompt=SLOW))


async def crashed_attempt(
    client: ChatClient, store: SqliteStore, ctx: StepContext, chat_id: str, prompt: str
) -> int:
    """What a process that died mid-step leaves: its send journaled and made, no result.

    Returns the id of the user message the send committed.
    """
    attempts = sum(1 for m in await user_messages(client, chat_id) if ctx.marker in m.text())
    entry = JournalEntry(state="submitting", marker=ctx.marker, attempt=attempts)
    await store.write_journal(ctx.fence, chat_id, entry)
    sent = await client.send_message(chat_id, f"{ctx.marker} {prompt}")
    assert sent.message is not None
    return sent.message.id


async def user_messages(client: ChatClient, chat_id: str) -> list[ChatMessage]:
    return [m async for m in client.iter_messages(chat_id) if m.role == "user"]


async def first_step(
    client: ChatClient, store: DurableStore, fence: Fence, options: DurableOptions = FAST
) -> StepResult:
    """Step 1 of ``fence``'s workflow, "plan it", run to its end."""
    ctx = StepContext.fenced(client, store, fence, fence.workflow_id, 1, StepTools(), options)
    return await run_step(ctx, StepSpec(prompt="plan it"))


async def deadline_answers_twice(sim: Simulator, chat_id: str) -> None:
    """Coder's tool deadline answers the step's call, then the model's call again, with
    "timed out", and the turn finishes: what a recovery that came late finds."""
    for _ in range(2):
        await sim.wait_for_status(chat_id, "requires_action")
        sim.time_out_tools(chat_id)
    await sim.wait_for_status(chat_id, "waiting")


@asynccontextmanager
async def left_charge_step(
    sim: Simulator, store: DurableStore, workflow_id: str, prompt: str
) -> AsyncIterator[tuple[StepContext, str]]:
    """Step 1 of ``workflow_id`` as a run that died after sending ``prompt`` (it calls
    ``charge_card``) left it: the step's context, in a new run, and its chat."""
    CHARGES.clear()
    tools = StepTools.build([charge_card])
    async with (
        Wire(sim) as wire,
        ChatClient(base_url=sim.base_url, token=sim.token) as client,
    ):
        fence = await store.begin_run(str(sim.organization_id), workflow_id)
        ctx = StepContext.fenced(client, store, fence, workflow_id, 1, tools, FAST)
        yield ctx, await step_chat(wire, ctx, tools, prompt)
