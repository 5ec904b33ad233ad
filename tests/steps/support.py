"""What the step tests share: a charge tool that counts its calls, short timings, and the
``store`` fixture (an SQLite store of the test's own; the step and sweep conftests offer it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from coder_chat.client.options import ChatOptions
from coder_chat.durable.context import DurableOptions, StepContext, StepTools
from coder_chat.durable.markers import chat_labels
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.tools import durable_tool
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
