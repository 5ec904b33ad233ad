"""A workflow's budget, checked before each step from what the store recorded, and
Coder's usage limit, which stops a step the same way and is never retried."""

from __future__ import annotations

import pytest

from coder_chat import ChatClient
from coder_chat.durable.budget import Budget, OverBudget
from coder_chat.durable.context import DurableOptions, StepContext, StepTools
from coder_chat.durable.records import Fence
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.step import StepResult, StepSpec, run_step
from coder_chat.simulator import Simulator

from .support import FAST

PROMPTS = ["plan it", "do it", "check it"]


async def steps(
    client: ChatClient, store: SqliteStore, fence: Fence, options: DurableOptions, count: int
) -> list[StepResult]:
    done = []
    for step, prompt in enumerate(PROMPTS[:count], start=1):
        ctx = StepContext.fenced(
            client, store, fence, fence.workflow_id, step, StepTools(), options
        )
        done.append(await run_step(ctx, StepSpec(prompt=prompt)))
    return done


def with_budget(**limits: int | None) -> DurableOptions:
    return DurableOptions(
        chat=FAST.chat,
        step_deadline=FAST.step_deadline,
        poll_interval=FAST.poll_interval,
        budget=Budget(**limits),
    )


def sends(sim: Simulator) -> int:
    return sum(1 for r in sim.records.requests if r.route in ("send_message", "create_chat"))


@pytest.mark.parametrize("limit", ["max_turns", "max_tokens", "max_cost_micros"])
async def test_a_step_past_a_limit_is_not_taken(
    sim: Simulator, store: SqliteStore, limit: str
) -> None:
    sim.config.cost_micros_per_token = 7
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        measured = await steps(client, store, await store.begin_run(tenant, "wf-free"), FAST, 2)
        two = measured[0].usage + measured[1].usage
        reached = {
            "max_turns": 2,
            "max_tokens": two.tokens,
            "max_cost_micros": two.total_cost_micros,
        }
        options = with_budget(**{limit: reached[limit]})
        fence = await store.begin_run(tenant, f"wf-{limit}")
        await steps(client, store, fence, options, 2)
        before = sends(sim)
        with pytest.raises(OverBudget, match=f"at step 3: .*\\({limit}\\)") as stopped:
            await steps(client, store, fence, options, 3)
    assert sends(sim) == before  # nothing was sent for step 3
    assert stopped.value.step == 3 and not stopped.value.retryable
    workflow = await store.get_workflow(tenant, f"wf-{limit}")
    assert workflow is not None and workflow.spent == two  # kept with the steps


async def test_coders_usage_limit_stops_the_step_with_its_figures_and_sends_once(
    sim: Simulator, store: SqliteStore
) -> None:
    sim.config.cost_micros_per_token = 1000
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-coder")
        [first] = await steps(client, store, fence, FAST, 1)
        sim.config.usage_limit_micros = first.usage.total_cost_micros or 0
        before = sends(sim)
        with pytest.raises(OverBudget, match="Coder's usage limit is reached") as stopped:
            await steps(client, store, fence, FAST, 2)
        chat = await client.get_chat(first.chat_id)
    spent = f"${(first.usage.total_cost_micros or 0) / 1_000_000:,.4f}"
    assert f"(spent {spent} of {spent}; it resets at " in str(stopped.value)
    assert stopped.value.resets_at is not None
    assert sends(sim) == before + 1  # refused once, never sent again
    assert chat.status == "waiting"
    record = await store.get_chat(tenant, first.chat_id)
    assert record is not None and record.journal is not None
    assert record.journal.horizon is None  # refused: nothing is in flight to wait for


async def test_a_turn_coder_ends_at_its_limit_stops_the_step(
    sim: Simulator, store: SqliteStore
) -> None:
    sim.config.cost_micros_per_token = 1000
    sim.config.usage_limit_micros = 1  # the first model step passes it
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        ctx = StepContext.fenced(
            client, store, await store.begin_run(tenant, "wf-mid"), "wf-mid", 1, StepTools(), FAST
        )
        prompt = 'look it up /server-tool search {"q": "refunds"}'
        with pytest.raises(OverBudget, match="Chat usage limit exceeded") as stopped:
            await run_step(ctx, StepSpec(prompt=prompt))
    assert stopped.value.step == 1 and sends(sim) == 1
