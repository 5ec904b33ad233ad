"""A step whose pause a cancel answered "not run" goes again when the workflow is resumed.

The process died with the step paused on its durable tool; a person cancelled the
workflow, which answered the call "not run" (nothing is started while a chat is
retired), let the model finish, and archived the chat. The model's answer is no
finished step: its tool never ran. The resume sends the step again and runs the tool
once (the campaign's 20261312/4, where the step kept "charge failed" as its result).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from coder_chat import ChatClient
from coder_chat.durable.context import StepContext, StepTools
from coder_chat.durable.markers import step_marker
from coder_chat.durable.reconcile import NOT_RUN
from coder_chat.durable.records import JournalEntry, WorkflowState, utcnow
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.step import StepSpec, run_step
from coder_chat.durable.sweep import end_cancelled
from coder_chat.simulator import Simulator
from tests.simulator.wire import Wire

from .support import CHARGES, FAST, charge_card, step_chat


async def test_a_step_whose_calls_a_cancel_answered_not_run_goes_again_on_resume(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant, wf = str(sim.organization_id), "wf-cancel-not-run"
    CHARGES.clear()
    prompt = 'pay /tool charge_card {"amount_cents": 900}'
    tools = StepTools.build([charge_card])
    async with (
        Wire(sim) as wire,
        ChatClient(base_url=sim.base_url, token=sim.token) as client,
    ):
        fence = await store.begin_run(tenant, wf)
        ctx = StepContext.fenced(client, store, fence, wf, 1, tools, FAST)
        chat_id = await step_chat(wire, ctx, tools, prompt)
        await store.save_checkpoint(fence, chat_id, None)
        await sim.wait_for_status(chat_id, "requires_action")  # the process dies here

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


@pytest.mark.xfail(
    strict=True,
    reason=(
        "open (fleet campaign 24/3): a run that stops its turn on a cancel while its store is "
        "out of reach cannot journal the stop, and nothing else knows the attempt was cut; "
        "the sweep cannot tell it from a crash (journaling every cancelled attempt as cut "
        "resends finished ones: campaign 20261604/13). The fix to come: the run journals a "
        "stop before it sends it, and sends none it could not journal."
    ),
)
async def test_an_answer_a_cancel_cut_short_is_sent_again_on_resume(
    sim: Simulator, store: SqliteStore
) -> None:
    """The run was cancelled mid-turn and stopped it, but could not reach the store to say
    so (fleet campaign 24/3: its store cut off at that moment). The resume must send the
    step again, and never keep the empty answer the interrupt left as the step's result."""
    tenant, wf = str(sim.organization_id), "wf-cancel-cut"
    tools = StepTools()
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, wf)
        first = await run_step(
            StepContext.fenced(client, store, fence, wf, 1, tools, FAST), StepSpec(prompt="plan it")
        )
        chat_id = first.chat_id
        marker, prompt = step_marker(wf, 2), "think it over /sleep 5"
        # Step 2 as the run sends it: journaled first, then sent; then the cancel's stop.
        horizon = utcnow() + timedelta(seconds=10)
        entry = JournalEntry(state="submitting", marker=marker, attempt=0, horizon=horizon)
        await store.write_journal(fence, chat_id, entry)
        await client.send_message(chat_id, f"{marker} {prompt}")
        await sim.wait_for_status(chat_id, "running")
        await client.interrupt_chat(chat_id)
        await sim.wait_for_status(chat_id, "waiting")

        workflow = await store.get_workflow(tenant, wf)
        assert workflow is not None
        await end_cancelled(client, store, workflow, [], tools, FAST, print)

        resumed = await store.begin_run(tenant, wf)
        await client.update_chat(chat_id, archived=False)
        again = StepContext.fenced(client, store, resumed, wf, 2, tools, FAST)
        result = await run_step(again, StepSpec(prompt=prompt))
    assert result.verdict == "resubmitted", result
    assert result.text == f'You said: "{marker} think it over"'
