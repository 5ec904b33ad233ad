"""What a durable step costs beyond the turn it wraps: no request, two store commits.

Counted, not timed: the simulator records every request it served, and the store
counts the write transactions it committed.
"""

from __future__ import annotations

import pytest

from coder_chat import ChatClient, ChatSession
from coder_chat.client.options import ChatOptions
from coder_chat.durable.context import DurableOptions, StepContext, StepTools
from coder_chat.durable.fence import FenceGuard
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.step import StepSpec, run_step
from coder_chat.simulator import Simulator

FAST = DurableOptions(chat=ChatOptions(request_timeout=10), step_deadline=30, poll_interval=0.02)


def served(sim: Simulator) -> list[str]:
    return [r.route for r in sim.records.requests]


async def bare_turns(sim: Simulator, client: ChatClient) -> tuple[list[str], list[str]]:
    """The routes of a bare first turn, and of a bare turn on a checkpointed chat."""
    session = ChatSession(client=client, organization_id=str(sim.organization_id))
    before = len(sim.records.requests)
    await session.generate("first")
    first = served(sim)[before:]
    resumed = ChatSession(
        client=client,
        organization_id=str(sim.organization_id),
        chat_id=session.chat_id,
        last_seen_message_id=session.last_seen_message_id,
    )
    before = len(sim.records.requests)
    await resumed.generate("second")
    return first, served(sim)[before:]


async def test_a_durable_step_makes_the_requests_of_a_bare_turn_and_two_commits(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        bare_first, bare_resumed = await bare_turns(sim, client)
        fence = await store.begin_run(tenant, "wf-cost")
        costs = []
        for step in (1, 2, 3):
            ctx = StepContext.fenced(
                client, store, fence, "wf-cost", step, StepTools(), FAST, first_try=True
            )
            before, commits = len(sim.records.requests), store.commits
            result = await run_step(ctx, StepSpec(prompt=f"step {step}"))
            assert result.verdict == "ran"
            costs.append((served(sim)[before:], store.commits - commits))
    assert bare_first == ["create_chat", "stream"] and bare_resumed == ["send_message", "stream"]
    first, later = costs[0], costs[1:]
    assert first == (bare_first, 1)  # the create is not journaled: one commit, the step's own
    assert all(cost == (bare_resumed, 2) for cost in later), later  # journal + step


async def test_a_first_step_that_may_have_run_before_looks_for_its_orphan(
    sim: Simulator, store: SqliteStore
) -> None:
    """Not the first try (a retry, or a rerun of the workflow): an orphan may exist, so
    the step asks Coder for chats labelled with this workflow first."""
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-retry")
        ctx = StepContext.fenced(client, store, fence, "wf-retry", 1, StepTools(), FAST)
        await run_step(ctx, StepSpec(prompt="hello"))
    assert served(sim) == ["list_chats", "create_chat", "stream"]


async def test_a_step_leaves_its_fence_confirmed_for_what_comes_next(
    sim: Simulator, store: SqliteStore
) -> None:
    """The step's last write is fenced, so it proves the run still holds the workflow:
    the archive that follows a turn longer than the guard's freshness reads nothing."""
    tenant = str(sim.organization_id)
    sim.config.step_delay = 0.3  # the turn outlasts the confirmation its journal write gave
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-guard")
        guard = FenceGuard(store, fence, fresh_for=0.2)
        for step in (1, 2):
            ctx = StepContext(client, guard, "wf-guard", step, StepTools(), FAST)
            await run_step(ctx, StepSpec(prompt=f"step {step}"))
            assert guard.fresh, f"step {step} left its fence unconfirmed"


async def test_a_context_in_the_older_shape_is_refused_at_once(
    sim: Simulator, store: SqliteStore
) -> None:
    """``StepContext(client, store, fence, ...)`` would shift every field and fail far away."""
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(str(sim.organization_id), "wf-shape")
        with pytest.raises(TypeError, match=r"StepContext\.fenced\(client, store, fence"):
            StepContext(client, store, fence, "wf-shape", 1, StepTools(), FAST)  # type: ignore[arg-type]
