"""Recovery when a send that a dead process had in flight lands late, out of order.

Found by the campaign (seed 918273, schedules 189 and 193, two workflows at once):
a held send landed after the step was sent again and went on, or landed while a
recovery was reading the chat. Recovery must still take the step's own whole
answer, and send nothing again.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from coder_chat import ChatClient
from coder_chat.client.options import ChatOptions
from coder_chat.durable.context import DurableOptions, StepContext, StepTools
from coder_chat.durable.markers import count_attempts
from coder_chat.durable.records import JournalEntry, utcnow
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.step import StepSpec, recover, run_step
from coder_chat.simulator import Simulator

FAST = DurableOptions(
    chat=ChatOptions(request_timeout=10, redial_initial=0.01), step_deadline=30, poll_interval=0.02
)


async def prompts(client: ChatClient, chat_id: str) -> list[str]:
    return [m.text() async for m in client.iter_messages(chat_id) if m.role == "user"]


async def test_an_earlier_steps_late_prompt_after_this_steps_answer_hides_nothing(
    sim: Simulator, store: SqliteStore
) -> None:
    """Step 2 was sent and answered, then its process died; then step 1's prompt, sent
    by a process that died earlier, lands late. Step 2's prompt is no longer the last
    one in the chat, but it was sent and answered: recovery takes that answer."""
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-late-1")
        step_1 = StepContext.fenced(client, store, fence, "wf-late-1", 1, StepTools(), FAST)
        first = await run_step(step_1, StepSpec(prompt="plan it"))
        step_2 = StepContext.fenced(client, store, fence, "wf-late-1", 2, StepTools(), FAST)
        entry = JournalEntry(state="submitting", marker=step_2.marker, attempt=0)
        await store.write_journal(fence, first.chat_id, entry)
        await client.send_message(first.chat_id, f"{step_2.marker} summarise")
        await sim.wait_for_status(first.chat_id, "waiting")
        await client.send_message(first.chat_id, f"{step_1.marker} plan it")  # the late one
        await sim.wait_for_status(first.chat_id, "waiting")
        assert await count_attempts(client, first.chat_id, step_2.marker) == 1
        recovered = await run_step(step_2, StepSpec(prompt="summarise"))
        sent = await prompts(client, first.chat_id)
    assert recovered.verdict == "recovered"
    assert recovered.text == 'You said: "[wf-late-1/step-2] summarise"'
    assert len(sent) == 3  # step 1, step 2, step 1 late: step 2 was not sent again


async def test_a_prompt_landing_while_recovery_reads_the_chat_is_waited_for(
    sim: Simulator, store: SqliteStore
) -> None:
    """The crashed attempt's send lands just after recovery read the chat as idle and
    before it read the history: the prompt is there with no answer yet. Recovery must
    wait for the answer, not take the empty one."""
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-late-2")
        step_1 = StepContext.fenced(client, store, fence, "wf-late-2", 1, StepTools(), FAST)
        first = await run_step(step_1, StepSpec(prompt="plan it"))
        chat_id = first.chat_id
        ctx = StepContext.fenced(client, store, fence, "wf-late-2", 2, StepTools(), FAST)
        past = utcnow() - timedelta(seconds=1)  # its horizon passed: it is not waited for
        entry = JournalEntry(state="submitting", marker=ctx.marker, attempt=0, horizon=past)
        await store.write_journal(fence, chat_id, entry)
        # Recovery reads the chat's state twice (what it was, then until it is settled),
        # then the attempt from history: hold the second read's answer, idle, and land
        # the prompt then.
        sim.faults.hold("get_chat", "after", count=2, chat_id=uuid.UUID(chat_id))
        spec = StepSpec(prompt="think it over /sleep 0.5")
        recovering = asyncio.create_task(recover(ctx, spec, chat_id, "hard_crash"))
        sim.faults.decide((await sim.faults.wait_held("get_chat")).id, "release")
        held = await sim.faults.wait_held("get_chat")
        await client.send_message(chat_id, f"{ctx.marker} {spec.prompt}")
        await sim.wait_for_status(chat_id, "running")
        sim.faults.decide(held.id, "release")
        recovered = (await asyncio.wait_for(recovering, timeout=30)).answer
        sent = await prompts(client, chat_id)
    assert recovered is not None
    assert recovered.text == 'You said: "[wf-late-2/step-2] think it over"'
    assert len(sent) == 2
