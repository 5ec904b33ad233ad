"""Code that changes under running workflows: a refused run leaves the workflow exactly as it
was, and a prompt changes for new workflows behind ``chat.patched``.

A run "crashes" here by leaving its ``DurableChat`` with an exception that is not an
``Exception`` (as a killed process ends nothing): its workflow stays running in the store,
held by that run, with its finished steps, as a SIGKILL would leave it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import State

from coder_chat.durable.records import PromptChanged, WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator import Simulator
from prefect_coder import DurableChat
from prefect_coder.flows.orphan_sweep import orphan_sweep

from .support import sent

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.timeout(120)]


class Crash(BaseException):
    """Stands for a killed process: no ``Exception``, so the workflow's end never runs."""


def rows(db: Path, workflow_id: str) -> list[tuple[Any, ...]]:
    """Every stored row of the workflow, as the file holds it (bytes for bytes)."""
    with sqlite3.connect(db) as conn:
        return [
            *conn.execute("SELECT * FROM workflows WHERE workflow_id = ?", (workflow_id,)),
            *conn.execute(
                "SELECT * FROM steps WHERE workflow_id = ? ORDER BY step", (workflow_id,)
            ),
            *conn.execute(
                "SELECT * FROM chats WHERE workflow_id = ? ORDER BY chat_id", (workflow_id,)
            ),
        ]


async def flow_run_state(flow_run_id: str) -> tuple[str, str | None]:
    async with get_client() as client:
        state = (await client.read_flow_run(UUID(flow_run_id))).state
    assert state is not None
    return state.type.value, state.name


@flow
async def review(workflow_id: str, first: str, crash_after: int = 0) -> list[str]:
    """Two turns, the first prompt given; ``crash_after`` steps, the run dies."""
    async with DurableChat(workflow_id) as chat:
        for step, prompt in enumerate([first, "Now the second part"], start=1):
            await chat.turn(prompt)
            if step == crash_after:
                raise Crash
    return [r.verdict for r in chat.results]


async def test_a_changed_prompt_leaves_a_crashed_workflow_as_it_was_for_its_relaunch(
    sim: Simulator, coder_env: Path
) -> None:
    wid = "review-404"
    with pytest.raises(Crash):
        await review(wid, "Review the first file", crash_after=1)
    before = rows(coder_env, wid)
    store = SqliteStore(coder_env)
    try:
        crashed = await store.get_workflow(str(sim.organization_id), wid)
    finally:
        await store.close()
    assert crashed is not None and crashed.flow_run_id is not None
    assert crashed.state == WorkflowState.RUNNING and crashed.epoch == 1
    run_state = await flow_run_state(crashed.flow_run_id)
    requests = len(sim.records.requests)

    # Run again with its first prompt changed: refused, naming the step and the way out.
    state: State[Any] = await review(wid, "Review the first file, briefly", return_state=True)
    assert state.is_failed()
    with pytest.raises(PromptChanged, match="step 1 of workflow 'review-404'"):
        await state.aresult()
    assert len(sim.records.requests) == requests  # nothing sent
    assert rows(coder_env, wid) == before  # no epoch taken, no run named, nothing marked
    assert await flow_run_state(crashed.flow_run_id) == run_state  # not superseded

    # The sweep finds it stranded (its run crashed), and does not mark it failed.
    swept = await orphan_sweep(
        target_deployment="local", stale_heartbeat_seconds=0.0, self_heal=False
    )
    assert swept["stranded"] == 1
    assert rows(coder_env, wid) == before

    # Its relaunch, on the code it ran, carries it on: step 1 from the store, step 2 sent.
    assert await review(wid, "Review the first file") == ["stored", "ran"]
    assert sent(sim, "Review the first file") == 1
    assert sent(sim, "Now the second part") == 1


@flow
async def plan(workflow_id: str, version: int, crash_after: int = 0) -> list[str]:
    """v1 plans at length; v2 asks for a short plan, behind a patch."""
    async with DurableChat(workflow_id) as chat:
        if version >= 2 and chat.patched("shorter-plan"):
            prompt = "Plan it in three lines"
        else:
            prompt = "Plan it"
        await chat.turn(prompt)
        if crash_after == 1:
            raise Crash
        await chat.turn("Carry out the plan")
    return [r.verdict for r in chat.results]


async def test_a_patch_changes_the_prompt_of_new_workflows_only(
    sim: Simulator, coder_env: Path
) -> None:
    with pytest.raises(Crash):
        await plan("plan-old", version=1, crash_after=1)
    # v2 deployed: the old workflow passed the patch before, so it goes on with v1's prompt.
    assert await plan("plan-old", version=2) == ["stored", "ran"]
    # A new workflow reaches the patch with v2: the new prompt.
    assert await plan("plan-new", version=2) == ["ran", "ran"]
    assert sent(sim, "[plan-old/step-1] Plan it") == 1
    assert sent(sim, "[plan-new/step-1] Plan it in three lines") == 1
    assert sent(sim, "Plan it in three lines") == 1
    # Every run decides the same: the decisions are kept with the workflows.
    store = SqliteStore(coder_env)
    try:
        tenant = str(sim.organization_id)
        old = await store.get_workflow(tenant, "plan-old")
        new = await store.get_workflow(tenant, "plan-new")
    finally:
        await store.close()
    assert old is not None and old.patches == {"shorter-plan": False}
    assert new is not None and new.patches == {"shorter-plan": True}
    # A replay of the finished new workflow with v2 takes the patched path again (no refusal).
    assert await plan("plan-new", version=2) == ["stored", "stored"]
