"""A workflow's token budget holds across a kill: the run that carries it on, on another
machine, reads the spend the store recorded and stops at the same step as a run never
killed, in a state of its own (over budget), its chat archived; the sweep leaves it be,
and running it again with a higher budget finishes it (issue 27).

Real child processes killed with SIGKILL, the simulator over sockets, a real SQLite store.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.objects import StateType

from coder_chat import ChatClient
from coder_chat.durable.markers import step_marker
from coder_chat.durable.records import WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.sweep import SweepPolicy, sweep
from coder_chat.protocol.usage import UsageTotals
from tests.lab.children import CHARGE_CARD, Child, CrashLab

from .invariants import attempts_of
from .story import only_chat

pytestmark = pytest.mark.timeout(300)

PROMPTS = [
    "plan the refund",
    'charge the card /tool charge_card {"amount_cents": 1299}',
    "confirm it",
    "summarise it",
]


def params(wf: str, **settings: Any) -> dict[str, Any]:
    return {"workflow_id": wf, "prompts": PROMPTS, "tools": [CHARGE_CARD], **settings}


async def steps_of(lab: CrashLab, wf: str) -> tuple[WorkflowState | None, list[UsageTotals]]:
    store = SqliteStore(lab.db)
    try:
        workflow = await store.get_workflow(lab.tenant, wf)
        steps = await store.list_steps(lab.tenant, wf)
    finally:
        await store.close()
    return (workflow.state if workflow else None), [s.usage for s in steps]


async def stopped(child: Child) -> None:
    """The child's flow ended without returning (its run aborted, over budget)."""
    async with asyncio.timeout(120):
        code = await child.proc.wait()
    assert code != 0, child.tail()
    assert "stopped over budget at step 3" in child.output(), child.tail()


async def run_state(wf: str) -> tuple[str | None, str | None]:
    """The name and message of the state the workflow's last flow run ended in."""
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"workflow:{wf}"]))
        )
    last = max(runs, key=lambda r: str(r.created))
    assert last.state is not None and last.state.type == StateType.CANCELLED, last.state
    return last.state_name, last.state.message


async def test_a_token_budget_stops_at_the_same_step_after_a_kill_and_a_resume_goes_on(
    lab: CrashLab,
) -> None:
    sim = lab.sim
    # Without a budget: what each step uses (the same words, so the same tokens, whatever
    # the workflow's id). The budget is what the first two use: step 3 is not taken.
    await lab.finish(await lab.start(**params("wf-budget-ref"), reruns=1))
    _, used = await steps_of(lab, "wf-budget-ref")
    budget = used[0].tokens + used[1].tokens

    # Never killed: it stops before step 3.
    await stopped(await lab.start(**params("wf-budget-plain", max_tokens=budget)))
    state, plain = await steps_of(lab, "wf-budget-plain")
    assert state == WorkflowState.OVER_BUDGET and plain == used[:2]

    # Killed inside step 2's charge, carried on by another machine: the same stop.
    wf = "wf-budget-kill"
    lab.payments.hold("after")
    first = await lab.start(**params(wf, max_tokens=budget))
    await lab.spawn(lab.machine("b"), **params(wf, max_tokens=budget))
    held = await lab.held(lab.payments.wait_held(timeout=90), first, "charge held")
    await lab.crash(first)
    lab.payments.decide(held.id, "release")
    await stopped(await lab.start(env=lab.machine("b"), **params(wf, max_tokens=budget)))
    state, killed = await steps_of(lab, wf)
    assert state == WorkflowState.OVER_BUDGET and killed == used[:2]
    chat = only_chat(lab, wf)
    assert sim.chat(chat.id).archived
    assert not attempts_of(sim.messages(chat.id), step_marker(wf, 3))  # never sent
    name, message = await run_state(wf)
    assert name == "Over budget", (name, message)
    assert message is not None and f"its limit is {budget:,} (max_tokens)" in message

    # The sweep leaves it be: not stranded, nothing relaunched, its chat not touched.
    store = SqliteStore(lab.db)
    try:
        async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
            report = await sweep(
                client,
                store,
                lab.tenant,
                SweepPolicy(orphan_age=0, stale_heartbeat=0),
                report=lambda _: None,
            )
    finally:
        await store.close()
    assert wf not in [w.workflow_id for w in report.stranded]
    assert not [f for f in report.acted() if f.workflow_id == wf]

    # Run again with a higher budget: it carries on from step 3 and finishes.
    results = await lab.finish(await lab.start(**params(wf, max_tokens=budget * 10)))
    assert [r["verdict"] for r in results] == ["stored", "stored", "ran", "ran"]
    state, resumed = await steps_of(lab, wf)
    assert state == WorkflowState.FINISHED and resumed[:2] == used[:2]
    assert len(lab.payments.applied) == 4 - 1  # ref, plain, killed: each charged once
