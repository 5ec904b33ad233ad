"""What a step consumed: counted from the chat's assistant messages, over all its
attempts, each message once; stored with the step and returned with it.

The simulator is the ground truth: the usage it committed on every assistant message of
a chat must equal, exactly, the sum of the usage the steps on that chat recorded.
"""

from __future__ import annotations

from dataclasses import replace

from coder_chat import ChatClient, CoderChatError
from coder_chat.client.options import ChatOptions
from coder_chat.durable.context import StepContext, StepTools
from coder_chat.durable.markers import usage_after
from coder_chat.durable.records import AfterSteps, WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.step import StepResult, StepSpec, run_step
from coder_chat.protocol.usage import UsageTotals
from coder_chat.simulator import Simulator
from tests.lab.truth import committed_usage
from tests.simulator.wire import Wire

from .support import CHARGES, FAST, charge_card, first_step, step_chat

PAY = 'pay /tool charge_card {"amount_cents": 500}'


def committed(sim: Simulator, chat_id: str) -> UsageTotals:
    return committed_usage([sim.chat(chat_id)])


def total(results: list[StepResult]) -> UsageTotals:
    return sum((r.usage for r in results), UsageTotals())


async def test_each_step_counts_its_own_stretch_and_the_steps_add_up_to_the_chat(
    sim: Simulator, store: SqliteStore
) -> None:
    sim.config.cost_micros_per_token = 2
    tenant, tools = str(sim.organization_id), StepTools.build([charge_card])
    CHARGES.clear()
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-use")
        results = []
        for step, prompt in enumerate(["plan it", PAY, "summarise it all"], start=1):
            ctx = StepContext.fenced(client, store, fence, "wf-use", step, tools, FAST)
            results.append(await run_step(ctx, StepSpec(prompt=prompt)))
        chat_id = results[0].chat_id
        rerun = await store.begin_run(tenant, "wf-use")
        stored = await run_step(
            StepContext.fenced(client, store, rerun, "wf-use", 2, tools, FAST), StepSpec(PAY)
        )
    assert total(results) == committed(sim, chat_id)
    plan, pay, summary = (r.usage for r in results)
    assert (plan.messages, pay.messages, summary.messages) == (1, 2, 1)  # the call, the answer
    assert all((u.output_tokens or 0) > 0 and u.total_cost_micros for u in (plan, pay, summary))
    assert (summary.cache_read_tokens or 0) > (plan.cache_read_tokens or 0)  # it grew
    assert (stored.verdict, stored.usage) == ("stored", pay)
    assert [s.usage for s in await store.list_steps(tenant, "wf-use")] == [plan, pay, summary]


async def test_a_timed_out_turn_and_the_retry_that_resends_it_are_both_counted(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    hasty = replace(FAST, chat=ChatOptions(request_timeout=0.5, redial_initial=0.01))
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-slow")
        ctx = StepContext.fenced(client, store, fence, "wf-slow", 1, StepTools(), hasty)
        sim.script("slow", '/server-tool read_file {"path": "a"} /sleep 5', times=1)
        try:
            await run_step(ctx, StepSpec(prompt="slow"))
        except CoderChatError as exc:
            assert exc.kind == "timeout"
        else:
            raise AssertionError("the first attempt should have timed out")
        retry = StepContext.fenced(client, store, fence, "wf-slow", 1, StepTools(), FAST)
        again = await run_step(retry, StepSpec(prompt="slow"))
    assert again.verdict == "resubmitted"
    assert again.usage == committed(sim, again.chat_id)


async def test_a_step_on_a_chat_made_before_it_counts_from_where_the_last_step_ended(
    sim: Simulator, store: SqliteStore
) -> None:
    """A checkpoint past the step before's cursor (an earlier attempt's, whose send never
    left) still leaves the stretch in between to this step."""
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-gap")
        first = await first_step(client, store, fence)
        # Something ran on the chat past step 1's end (a person's prompt in Coder's UI).
        await client.send_message(first.chat_id, "and another thing")
        await sim.wait_for_status(first.chat_id, "waiting")
        last = (await client.get_messages(first.chat_id, limit=1)).messages[0].id
        await store.save_checkpoint(fence, first.chat_id, last)
        second = await run_step(
            StepContext.fenced(client, store, fence, "wf-gap", 2, StepTools(), FAST),
            StepSpec(prompt="summarise"),
        )
    assert second.verdict == "ran" and second.usage.messages == 2
    assert first.usage + second.usage == committed(sim, first.chat_id)


async def test_a_chat_the_step_made_and_a_crash_left_is_counted_whole(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-orphan")
        ctx = StepContext.fenced(client, store, fence, "wf-orphan", 1, StepTools(), FAST)
        async with Wire(sim) as wire:
            chat_id = await step_chat(wire, ctx, ctx.tools, "plan it")
        await sim.wait_for_status(chat_id, "waiting")
        adopted = await run_step(ctx, StepSpec(prompt="plan it"))
    assert (adopted.verdict, adopted.chat_id) == ("recovered", chat_id)
    assert adopted.usage == committed(sim, chat_id) and adopted.usage.messages == 1


async def test_what_ran_after_the_last_step_counts_until_a_later_step_finishes(
    sim: Simulator, store: SqliteStore
) -> None:
    """A prompt of the last step that landed late, after it finished, ran on the chat: the
    workflow's end reads that stretch and keeps it. A later step (a resumed workflow's)
    counts the stretch as its own, and the kept figure no longer adds."""
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-late")
        ctx = StepContext.fenced(client, store, fence, "wf-late", 1, StepTools(), FAST)
        first = await run_step(ctx, StepSpec(prompt="plan it"))
        await client.send_message(first.chat_id, f"{ctx.marker} plan it")
        await sim.wait_for_status(first.chat_id, "waiting")
        late = await usage_after(client, first.chat_id, first.last_seen_message_id or 0)
        await store.finish(fence, WorkflowState.FINISHED, AfterSteps(step=1, usage=late))
        ended = await store.get_workflow(tenant, "wf-late")
        at_end = await store.list_steps(tenant, "wf-late")

        resumed = await store.begin_run(tenant, "wf-late")
        second = await run_step(
            StepContext.fenced(client, store, resumed, "wf-late", 2, StepTools(), FAST),
            StepSpec(prompt="go on"),
        )
        carried = await store.get_workflow(tenant, "wf-late")
        steps = await store.list_steps(tenant, "wf-late")
    assert late.messages == 1 and ended is not None and carried is not None
    assert ended.usage(at_end) == first.usage + late
    assert second.usage.messages == 2  # the late prompt's answer, and its own
    assert carried.usage(steps) == first.usage + second.usage == committed(sim, first.chat_id)
