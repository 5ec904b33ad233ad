"""run_step against the simulator and a real SQLite store, in one process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from coder_chat import ChatClient, CoderStreamError
from coder_chat.durable.context import DurableOptions, StepContext, StepTools
from coder_chat.durable.markers import LABEL_STEP, LABEL_WORKFLOW
from coder_chat.durable.records import JournalEntry
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.step import StepSpec, run_step
from coder_chat.durable.tools import durable_tool
from coder_chat.simulator import Simulator, SimulatorConfig, serve_simulator
from tests.conftest import fast_config

CHARGES: list[tuple[int, str]] = []


@durable_tool
async def charge_card(amount_cents: int, idempotency_key: str) -> str:
    """Charge the customer's card."""
    CHARGES.append((amount_cents, idempotency_key))
    return f"receipt-{len(CHARGES)}"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "ledger.db")
    yield s
    await s.close()


FAST = DurableOptions(request_timeout=10, step_deadline=30, poll_interval=0.02, redial_initial=0.01)


async def test_three_steps_then_a_rerun_recovers(sim: Simulator, store: SqliteStore) -> None:
    tenant = str(sim.organization_id)
    CHARGES.clear()
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-1")
        tools = StepTools.build([charge_card])
        prompts = ["plan it", 'pay /tool charge_card {"amount_cents": 500}', "summarise"]
        results = []
        for step, prompt in enumerate(prompts, start=1):
            ctx = StepContext(client, store, fence, "wf-1", step, tools, FAST)
            results.append(await run_step(ctx, StepSpec(prompt=prompt)))
        assert [r.verdict for r in results] == ["ran", "ran", "ran"]
        assert results[0].text == 'You said: "[wf-1/step-1] plan it"'
        assert "receipt-1" in results[1].text
        chat_id = results[0].chat_id
        assert {r.chat_id for r in results} == {chat_id}
        assert sim.chat(chat_id).labels[LABEL_WORKFLOW] == "wf-1"
        assert sim.chat(chat_id).labels[LABEL_STEP] == "1"
        assert (
            len(CHARGES) == 1
            and CHARGES[0][1] == f"{tenant}/{chat_id}/" + CHARGES[0][1].split("/")[-1]
        )
        users_before = [m for m in sim.messages(chat_id) if m.role == "user"]

        # A re-run of step 2 (as after a crash that lost its result) recovers, never resends.
        again = await run_step(
            StepContext(client, store, fence, "wf-1", 3, tools, FAST), StepSpec(prompt=prompts[2])
        )
        assert again.verdict == "recovered"
        assert again.text == results[2].text
        assert [m for m in sim.messages(chat_id) if m.role == "user"] == users_before
        assert len(CHARGES) == 1
        workflow = await store.get_workflow(tenant, "wf-1")
        assert workflow is not None and workflow.chat_id == chat_id


async def test_a_stream_failure_discards_and_retires_the_new_chat(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    sim.faults.drop_streams(after_events=0, times=5)  # exactly the redial budget
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-discard")
        ctx = StepContext(client, store, fence, "wf-discard", 1, StepTools(), FAST)
        with pytest.raises(CoderStreamError) as caught:
            await run_step(ctx, StepSpec(prompt="hello"))
        assert caught.value.retryable  # a fresh chat with nothing outside it
        lost = caught.value.chat_id
        assert lost is not None
        record = await store.get_chat(tenant, lost)
        assert record is not None and record.discarded
        assert sim.chat(lost).archived  # no tool effect to reconcile: retired at once
        workflow = await store.get_workflow(tenant, "wf-discard")
        assert workflow is not None and workflow.chat_id is None  # nothing checkpointed
        retried = await run_step(ctx, StepSpec(prompt="hello"))  # the retry: a fresh chat
    assert retried.chat_id != lost and retried.verdict == "ran"
    assert retried.text == 'You said: "[wf-discard/step-1] hello"'


SLOW_RUNS: list[str] = []
SIM_CONFIG: list[SimulatorConfig] = []


@durable_tool
async def slow_charge(amount_cents: int, idempotency_key: str) -> str:
    """Charge, slower than the server's tool deadline."""
    # The first call's 0.3 s deadline is already running; give the model's second
    # call (after the server times this one out) a deadline it can meet.
    asyncio.get_running_loop().call_later(0.1, setattr, SIM_CONFIG[0], "tool_result_deadline", 5.0)
    await asyncio.sleep(0.6)
    SLOW_RUNS.append(idempotency_key)
    return f"charged {amount_cents}"


async def test_a_tool_the_server_timed_out_is_answered_from_the_ledger_when_called_again(
    tmp_path: Path, store: SqliteStore
) -> None:
    SLOW_RUNS.clear()
    config = fast_config(tool_result_deadline=0.3)
    SIM_CONFIG[:] = [config]
    async with serve_simulator(config) as sim:
        tenant = str(sim.organization_id)
        async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
            fence = await store.begin_run(tenant, "wf-deadline")
            ctx = StepContext(
                client, store, fence, "wf-deadline", 1, StepTools.build([slow_charge]), FAST
            )
            result = await run_step(
                ctx, StepSpec(prompt='pay /tool slow_charge {"amount_cents": 9}')
            )
        results = [r for r in sim.records.tool_results if r.tool_name == "slow_charge"]
    # The server timed the first call out; the model called again with the same
    # arguments; the second call was answered from the first call's ledger entry.
    assert [(r.synthetic, r.output) for r in results] == [
        (True, "Tool execution timed out"),
        (False, "charged 9"),
    ]
    assert len(SLOW_RUNS) == 1  # the effect ran once
    entries = await store.list_tools(tenant, result.chat_id)
    assert [e.state for e in entries] == ["done", "done"]
    assert entries[0].output == entries[1].output == "charged 9"


async def test_a_resubmitted_step_is_told_what_its_tools_already_did(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    CHARGES.clear()
    prompt = 'pay /tool charge_card {"amount_cents": 300}'
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-notes")
        ctx = StepContext(client, store, fence, "wf-notes", 1, StepTools.build([charge_card]), FAST)
        first = await run_step(ctx, StepSpec(prompt=prompt))
        # As if that attempt had timed out: its timeout fired an interrupt, so
        # recovery must treat it as cut short and resubmit.
        entry = JournalEntry(state="submitting", marker=ctx.marker, attempt=0, reason="timeout")
        await store.write_journal(fence, first.chat_id, entry)
        again = await run_step(ctx, StepSpec(prompt=prompt))
    assert again.verdict == "resubmitted"
    users = [m.text() for m in sim.messages(first.chat_id) if m.role == "user"]
    assert len(users) == 2 and "charge_card already ran for this step" in users[1]
    assert len(CHARGES) == 1  # the resubmitted step's call was answered from the ledger
