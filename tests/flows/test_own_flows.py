"""Durable turns in a user's own flow: the README's refund example, and the rules of the API.

Every test runs real flows on Prefect's test API against the simulator, with the fake
payments service counting refunds per idempotency key.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
from prefect.client.schemas.objects import FlowRun, State, StateType
from prefect.flow_runs import aresume_flow_run

from coder_chat.durable.records import PromptChanged, WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator import Simulator
from prefect_coder import DurableChat, Superseded, WorkflowSettings
from prefect_coder.examples.refund import refund_order
from prefect_coder.payments import Ledger, serve_payments
from tests.lab.truth import committed_usage

from .support import script_refund, sent, superseded_by_its_successor

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.timeout(120)]

PLAN = "Plan the refund"


@pytest.fixture
async def payments(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Ledger]:
    async with serve_payments() as (url, ledger):
        monkeypatch.setenv("PAYMENTS_URL", url)
        yield ledger


async def store_snapshot(db: Path, tenant: str, workflow_id: str) -> tuple[Any, ...]:
    store = SqliteStore(db)
    try:
        workflow = await store.get_workflow(tenant, workflow_id)
        steps = await store.list_steps(tenant, workflow_id)
    finally:
        await store.close()
    return workflow, steps


async def test_a_small_refund_runs_its_two_turns_without_asking(
    sim: Simulator, coder_env: Path, payments: Ledger
) -> None:
    script_refund(sim, "7", 2500)
    text = await refund_order(order_id="7", complaint="It arrived broken")
    assert "refunded 2500 cents" in text
    assert list(payments.applied.values()) == [1]
    workflow, steps = await store_snapshot(coder_env, str(sim.organization_id), "refund-7")
    assert workflow.state == WorkflowState.FINISHED and len(steps) == 2
    assert steps[0].output == {"amount_cents": 2500, "reason": "broken on arrival"}
    assert sim.chat(steps[0].chat_id).archived


async def wait_for_state(name_part: str, state: StateType, timeout: float = 60) -> FlowRun:
    """The flow run of ``refund-order`` whose name contains ``name_part`` once in ``state``."""
    async with asyncio.timeout(timeout), get_client() as client:
        while True:
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=name_part))
            )
            found = [r for r in runs if r.state_type == state]
            if found:
                return found[0]
            await asyncio.sleep(0.2)


async def refund_paused(
    sim: Simulator, order_id: str, cents: int, complaint: str
) -> tuple[asyncio.Task[str], FlowRun]:
    """A refund large enough to wait for a person, started and seen paused for its answer."""
    script_refund(sim, order_id, cents)
    running = asyncio.create_task(refund_order(order_id=order_id, complaint=complaint))
    return running, await wait_for_state(f"refund-{order_id}", StateType.PAUSED)


async def test_a_large_refund_waits_for_a_person_between_turns(
    sim: Simulator, coder_env: Path, payments: Ledger
) -> None:
    running, paused = await refund_paused(sim, "8", 25_000, "Never arrived")
    assert not payments.applied  # nothing is refunded while a person decides
    assert sent(sim, "[refund-8/step-2]") == 0
    # Its progress says what is done and what it waits for, while it waits.
    async with get_client() as client:
        artifacts = await client.read_latest_artifacts()
    [progress] = [a for a in artifacts if a.key == "progress-refund-8"]
    said = progress.description or ""
    assert "- step 1: ran" in said and "Waiting for a person's answer: Approval" in said, said
    await aresume_flow_run(paused.id, run_input={"approved": True})
    text = await running
    assert "refunded 25000 cents" in text
    assert list(payments.applied.values()) == [1]


async def test_a_declined_refund_takes_the_other_branch(
    sim: Simulator, coder_env: Path, payments: Ledger
) -> None:
    running, paused = await refund_paused(sim, "9", 50_000, "Wrong size")
    await aresume_flow_run(paused.id, run_input={"approved": False})
    text = await running
    assert "declined" in text and not payments.applied


async def test_a_rerun_replays_finished_turns_and_refuses_a_changed_prompt(
    sim: Simulator, coder_env: Path, payments: Ledger
) -> None:
    script_refund(sim, "10", 1000)
    first = await refund_order(order_id="10", complaint="Scratched")
    tenant = str(sim.organization_id)
    before = await store_snapshot(coder_env, tenant, "refund-10")
    requests = len(sim.records.requests)
    # The same flow, the same answers: every turn comes from the store, nothing is sent.
    assert await refund_order(order_id="10", complaint="Scratched") == first
    assert len(sim.records.requests) == requests
    # Another complaint makes another first prompt: refused, and nothing changes.
    state: State[Any] = await refund_order(order_id="10", complaint="Dented", return_state=True)
    assert state.is_failed()
    with pytest.raises(PromptChanged) as refused:
        await state.aresult()
    message = str(refused.value)
    assert "step 1 of workflow 'refund-10'" in message
    assert "'Scratched'" in message and "'Dented'" in message
    assert len(sim.records.requests) == requests
    assert await store_snapshot(coder_env, tenant, "refund-10") == before
    assert list(payments.applied.values()) == [1]


async def test_a_retried_flow_and_a_refused_prompt_leave_the_workflow_unfinished(
    sim: Simulator, coder_env: Path
) -> None:
    """A failure the flow's own retries take again ends nothing; nor does a refused prompt
    (code that changed between runs): the workflow stays unfinished, and the fixed code
    carries it on from where it was."""
    attempts: list[str] = []

    @flow(retries=1, retry_delay_seconds=0)
    async def changing() -> None:
        async with DurableChat(
            "wf-changed", settings=WorkflowSettings(heartbeat_seconds=0.2)
        ) as chat:
            attempts.append("try")
            if len(attempts) == 1:
                await chat.turn("first")
                raise RuntimeError("the flow's own code failed, once")
            await chat.turn("first, worded differently")

    @flow
    async def fixed() -> list[str]:
        async with DurableChat("wf-changed") as chat:
            await chat.turn("first")
            await chat.turn("second")
        return [r.verdict for r in chat.results]

    tenant = str(sim.organization_id)
    state: State[None] = await changing(return_state=True)
    assert len(attempts) == 2 and state.is_failed()
    with pytest.raises(PromptChanged, match="step 1 of workflow 'wf-changed'"):
        await state.aresult()
    workflow, steps = await store_snapshot(coder_env, tenant, "wf-changed")
    assert workflow.state == WorkflowState.RUNNING and [s.step for s in steps] == [1]
    assert not sim.chat(steps[0].chat_id).archived
    assert await fixed() == ["stored", "ran"]
    workflow, _ = await store_snapshot(coder_env, tenant, "wf-changed")
    assert workflow.state == WorkflowState.FINISHED
    assert sent(sim, "[wf-changed/step-1]") == 1


async def test_a_superseded_run_ends_superseded_and_sends_nothing_more(
    sim: Simulator, coder_env: Path
) -> None:
    """Run A is inside its first turn when run B takes the workflow over: A's turn
    finishes on Coder, but A writes nothing, sends nothing more, and ends Cancelled,
    naming B."""

    @flow
    async def two_turns(first: str) -> str:
        async with DurableChat("wf-taken", settings=WorkflowSettings(archive_at_end=False)) as chat:
            await chat.turn(first)
            return (await chat.turn("second")).text

    # A's first turn lasts long enough that B begins inside it, even on a loaded machine.
    slow = asyncio.create_task(two_turns(first="first /sleep 6"))
    while True:  # until A's first prompt is on the chat
        if sent(sim, "[wf-taken/step-1]"):
            break
        await asyncio.sleep(0.05)
    taken: State[str] = await two_turns(first="first /sleep 6", return_state=True)
    assert taken.is_completed()
    with pytest.raises(Superseded):
        await slow
    new = await superseded_by_its_successor("wf-taken")
    assert new.state is not None and new.state.is_completed()
    assert sent(sim, "[wf-taken/step-2]") == 1  # B's; A never sent step 2


async def test_a_run_whose_turns_a_successor_finished_ends_superseded(
    sim: Simulator, coder_env: Path
) -> None:
    """Run A waits between its turns (cut off, say) while run B takes the workflow and
    finishes it. A comes back: its next turn is read from the store (B finished it),
    A sends and writes nothing, and it ends Cancelled/Superseded naming B, not Failed
    by the fence its end of the workflow runs into (as the fleet lab saw it)."""
    between, resume = asyncio.Event(), asyncio.Event()

    @flow
    async def two_turns(wait: bool) -> str:
        async with DurableChat(
            "wf-outrun", settings=WorkflowSettings(archive_at_end=False)
        ) as chat:
            await chat.turn("first")
            if wait:
                between.set()
                await resume.wait()
            return (await chat.turn("second")).text

    cut_off = asyncio.create_task(two_turns(wait=True))
    await between.wait()
    successor: State[str] = await two_turns(wait=False, return_state=True)
    assert successor.is_completed()
    resume.set()
    with pytest.raises(Superseded) as caught:
        await cut_off
    # The state it was ended in goes out with it: Prefect's last word on the run says it.
    assert getattr(caught.value, "state", None) is not None
    assert caught.value.state.name == "Superseded"
    await superseded_by_its_successor("wf-outrun")
    assert sent(sim, "[wf-outrun/step-2]") == 1  # B's alone


async def test_a_persons_answer_is_kept_and_a_rerun_is_not_asked_again(
    sim: Simulator, coder_env: Path, payments: Ledger
) -> None:
    """The answer given between turns is kept with the workflow: the same flow run again
    replays its turns and is given the same answer, with no pause (it would wait here)."""
    script_refund(sim, "12", 40_000)
    running = asyncio.create_task(refund_order(order_id="12", complaint="Broken screen"))
    paused = await wait_for_state("refund-12", StateType.PAUSED)
    await aresume_flow_run(paused.id, run_input={"approved": True})
    first = await running
    workflow, _ = await store_snapshot(coder_env, str(sim.organization_id), "refund-12")
    assert workflow.inputs == [{"approved": True}]
    requests = len(sim.records.requests)
    assert await refund_order(order_id="12", complaint="Broken screen") == first
    assert len(sim.records.requests) == requests and list(payments.applied.values()) == [1]


async def test_a_workflow_whose_last_turn_came_from_the_store_says_its_chat_is_archived(
    sim: Simulator, coder_env: Path
) -> None:
    """A run that ends a workflow whose turns an earlier try finished retires its chat the
    whole way (it did not see the chat left idle), and its end still names that chat: the
    line a run of many workflows puts in its progress artifact."""
    tries: list[DurableChat] = []

    @flow(retries=1, retry_delay_seconds=0)
    async def ends_on_a_retry() -> str:
        async with DurableChat("wf-retired", owns_run=False) as chat:
            tries.append(chat)
            await chat.turn("the only turn")
            if len(tries) == 1:
                raise RuntimeError("the flow's own code failed after the turn, once")
        return chat.summary()

    said = await ends_on_a_retry()
    assert [r.verdict for r in tries[-1].results] == ["stored"]
    chat_id = tries[-1].results[0].chat_id
    assert sim.chat(chat_id).archived
    used = committed_usage([sim.chat(chat_id)]).describe()  # what the step recorded
    assert said == f"1 step(s), 1 stored; it used {used}; its chat {chat_id} is archived"
