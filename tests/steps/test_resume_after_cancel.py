"""A step whose pause a cancel answered "not run" goes again when the workflow is resumed.

The process died with the step paused on its durable tool; a person cancelled the
workflow, which answered the call "not run" (nothing is started while a chat is
retired), let the model finish, and archived the chat. The model's answer is no
finished step: its tool never ran. The resume sends the step again and runs the tool
once (the campaign's 20261312/4, where the step kept "charge failed" as its result).
"""

from __future__ import annotations

import asyncio

import pytest

from coder_chat import ChatClient
from coder_chat.durable.context import StepContext, StepTools
from coder_chat.durable.markers import step_marker
from coder_chat.durable.postgres import PostgresStore
from coder_chat.durable.reconcile import NOT_RUN
from coder_chat.durable.records import WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.step import StepSpec, run_step
from coder_chat.durable.sweep import end_cancelled
from coder_chat.simulator import Simulator
from tests.durable.backends import Backend
from tests.pgproxy import RoundTripProxy
from tests.simulator.wire import Wire

from .support import (
    CHARGES,
    FAST,
    SLOW,
    charge_card,
    left_charge_step,
    paused_step_one,
    step_one_then_two_sent,
    step_two_again,
)


async def test_a_step_whose_calls_a_cancel_answered_not_run_goes_again_on_resume(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant, wf = str(sim.organization_id), "wf-cancel-not-run"
    prompt = 'pay /tool charge_card {"amount_cents": 900}'
    async with left_charge_step(sim, store, wf, prompt) as (ctx, chat_id):
        await store.save_checkpoint(ctx.fence, chat_id, None)
        await sim.wait_for_status(chat_id, "requires_action")
        # the process dies here
        client, tools = ctx.client, ctx.tools

        workflow = await store.get_workflow(tenant, wf)
        assert workflow is not None
        retired = await end_cancelled(client, store, workflow, [chat_id], tools, FAST, print)
        assert [r.action for r in retired] == ["archived"]
        assert any(NOT_RUN in str(r.output) for r in sim.records.tool_results)
        cancelled = await store.get_workflow(tenant, wf)
        assert cancelled is not None and cancelled.state == WorkflowState.CANCELLED

        # The resume: a new run takes the workflow, reopens its chat, runs the step.
        resumed = await store.begin_run(tenant, wf)
        await client.update_chat(chat_id, archived=False)
        again = StepContext.fenced(client, store, resumed, wf, 1, tools, FAST)
        result = await run_step(again, StepSpec(prompt=prompt))
    assert result.verdict == "resubmitted"
    assert [amount for amount, _ in CHARGES] == [900]  # run once, by the resubmission
    assert "receipt-1" in result.text


async def test_a_prompt_a_dead_run_left_queued_never_runs_after_the_cancel(
    sim: Simulator, store: SqliteStore
) -> None:
    """The run died with its next step's prompt queued behind a pause (campaign
    20261607/25). The cancel answers the pause, which would start the queued prompt
    with no one to read its answer: it drops the queue first."""
    tenant, wf = str(sim.organization_id), "wf-cancel-queued"
    CHARGES.clear()
    tools = StepTools.build([charge_card])
    async with (
        Wire(sim) as wire,
        ChatClient(base_url=sim.base_url, token=sim.token) as client,
    ):
        fence = await store.begin_run(tenant, wf)
        ctx = StepContext.fenced(client, store, fence, wf, 1, tools, FAST)
        chat_id = await paused_step_one(sim, wire, ctx, 'pay /tool charge_card {"amount_cents": 5}')
        sent = await client.send_message(chat_id, f"{step_marker(wf, 2)} and then this")
        assert sent.queued  # the process dies here

        workflow = await store.get_workflow(tenant, wf)
        assert workflow is not None
        retired = await end_cancelled(client, store, workflow, [], tools, FAST, print)
        assert [r.action for r in retired] == ["archived"]
        page = await client.get_messages(chat_id)
    assert page.queued_messages == []
    assert not any(step_marker(wf, 2) in m.text() for m in page.messages)
    assert CHARGES == []


async def test_an_answer_the_cancels_stop_cut_short_is_sent_again_on_resume(
    sim: Simulator, store: SqliteStore
) -> None:
    """The run died mid-turn, its step's run still going; a person cancelled the
    workflow, whose end stopped that run (cutting its answer short) and archived the
    chat. Coder's history cannot tell a cut answer from a short one, so the stop was
    journaled before it was sent, and the resume sends the step again, never keeping
    what the interrupt left as the step's result."""
    tenant, wf = str(sim.organization_id), "wf-cancel-cut"
    tools = StepTools()
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, wf)
        chat_id = await step_one_then_two_sent(sim, client, store, fence, wf)  # then it died

        workflow = await store.get_workflow(tenant, wf)
        assert workflow is not None
        retired = await end_cancelled(client, store, workflow, [], tools, FAST, print)
        assert [r.action for r in retired] == ["archived"]
        assert sim.records.interrupts[0].status_before == "running"  # cut by the end
        record = await store.get_chat(tenant, chat_id)
        assert record is not None and record.journal is not None
        assert (record.journal.reason, record.journal.stopped_at) == ("abort", None)

        result = await step_two_again(client, store, tenant, wf, chat_id)
    assert result.verdict == "resubmitted", result
    assert result.text == f'You said: "{step_marker(wf, 2)} think it over"'


async def test_a_cancel_whose_stop_cannot_be_journaled_leaves_the_run_to_the_sweep(
    sim: Simulator, pg: Backend
) -> None:
    """Fleet lab 24/3: the run is cancelled mid-turn while its store is out of reach.
    Its interrupt, had it been sent, would have cut the answer with nothing left to say
    so. It journals the stop first, cannot, and sends none: the turn goes on, and the
    cancel's sweep, with the store back, stops it, journaling first. The resume sends the
    step again."""
    tenant, wf = str(sim.organization_id), "wf-cancel-cut-off"
    tools = StepTools()
    async with (
        RoundTripProxy(pg.dsn) as proxy,
        ChatClient(base_url=sim.base_url, token=sim.token) as client,
    ):
        direct = pg.open()
        through_proxy = PostgresStore(proxy.dsn, schema=pg.location, min_size=1, max_size=1)
        pg.stores.append(through_proxy)
        fence = await through_proxy.begin_run(tenant, wf)
        first = await run_step(
            StepContext.fenced(client, through_proxy, fence, wf, 1, tools, FAST),
            StepSpec(prompt="plan it"),
        )
        ctx = StepContext.fenced(client, through_proxy, fence, wf, 2, tools, FAST)
        running = asyncio.create_task(run_step(ctx, StepSpec(prompt=SLOW)))
        await sim.wait_for_status(first.chat_id, "running")
        await proxy.cut()
        ctx.guard.confirm()  # the fence was seen holding just now: the guard asks no store
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert sim.records.interrupts == []
        assert sim.chat(first.chat_id).status == "running"
        proxy.heal()

        workflow = await direct.get_workflow(tenant, wf)
        assert workflow is not None
        await end_cancelled(client, direct, workflow, [], tools, FAST, print)
        assert sim.records.interrupts[0].status_before == "running"  # cut by the end
        result = await step_two_again(client, direct, tenant, wf, first.chat_id)
    assert result.verdict == "resubmitted", result
    assert result.text == f'You said: "{step_marker(wf, 2)} think it over"'
