"""A person's cancel ends the workflow: the sweep tells it from a crash by the run's state in
Prefect, stops the turn, archives the chat, stores the workflow cancelled, and never
relaunches it; a run whose process was still going stops acting and says why.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from uuid import UUID

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.states import Cancelled, Cancelling

from coder_chat.durable.markers import LABEL_WORKFLOW
from coder_chat.durable.records import WorkflowRecord, WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator import Simulator
from prefect_coder import DurableChat, WorkflowCancelled, WorkflowSettings
from prefect_coder.flows.orphan_sweep import orphan_sweep
from tests.flows.support import Crash, first_then_second, sent

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.timeout(120)]

FIRST = "Read the repository"
SECOND = "Now write the report"


@flow
async def two_turns(workflow_id: str, crash_after_first: bool = False) -> list[str]:
    chat = DurableChat(workflow_id, settings=WorkflowSettings(heartbeat_seconds=0.5))
    return await first_then_second(chat, FIRST, SECOND, crash=crash_after_first)


async def stored(db: Path, sim: Simulator, workflow_id: str) -> WorkflowRecord:
    store = SqliteStore(db)
    try:
        workflow = await store.get_workflow(str(sim.organization_id), workflow_id)
    finally:
        await store.close()
    assert workflow is not None
    return workflow


async def run_named(name: str) -> FlowRun:
    async with get_client() as client:
        for _ in range(200):
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name]))
            )
            if runs:
                return runs[0]
            await asyncio.sleep(0.05)
    raise AssertionError(f"no flow run named {name!r}")


async def cancel(flow_run_id: UUID, *, done: bool) -> None:
    """As a person does from the UI: Cancelling; ``done``: as the worker leaves it once it
    killed the process, Cancelled."""
    async with get_client() as client:
        await client.set_flow_run_state(flow_run_id, Cancelling(), force=True)
        if done:
            await client.set_flow_run_state(flow_run_id, Cancelled(), force=True)


async def flow_run_logs(flow_run_id: UUID) -> str:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async with get_client() as client:
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
        )
    return "\n".join(log.message for log in logs)


async def test_a_cancelled_run_whose_process_is_gone_ends_its_workflow(
    sim: Simulator, coder_env: Path
) -> None:
    wid = "cancel-gone"
    sim.script(SECOND, "/sleep 60")
    with pytest.raises(Crash):
        await two_turns(wid, crash_after_first=True)
    run = await run_named(f"{wid} · epoch 1")
    await cancel(run.id, done=True)
    first = await orphan_sweep(target_deployment="local", stale_heartbeat_seconds=0.0)
    assert first["cancelled"] == 1 and first["relaunched"] == 0 and first["stranded"] == 0
    assert first["acted"] == 1  # its chat, archived with it (not "kept")
    workflow = await stored(coder_env, sim, wid)
    assert workflow.state == WorkflowState.CANCELLED and workflow.chat_id is not None
    assert sim.chat(workflow.chat_id).archived
    assert sent(sim, SECOND) == 0 and sent(sim, FIRST) == 1
    assert "is cancelled" in await flow_run_logs(run.id)
    # Nothing relaunches it, however often the sweep comes round.
    again = await orphan_sweep(target_deployment="local", stale_heartbeat_seconds=0.0)
    assert again["cancelled"] == 0 and again["stranded"] == 0
    assert (await stored(coder_env, sim, wid)).state == WorkflowState.CANCELLED


async def test_a_cancel_stops_a_running_turn_and_the_run_still_going_acts_no_more(
    sim: Simulator, coder_env: Path
) -> None:
    """The run's process outlived the cancel (no worker killed it): the sweep stops its turn
    and fences it out, and the run ends Cancelled, saying so, without sending step 2."""
    wid = "cancel-live"
    sim.script(FIRST, "/sleep 60")
    going = asyncio.create_task(two_turns(wid))
    run = await run_named(f"{wid} · epoch 1")
    for _ in range(200):
        if any(c.status == "running" for c in sim.chats()):
            break
        await asyncio.sleep(0.05)
    await cancel(run.id, done=False)
    swept = await orphan_sweep(target_deployment="local")
    assert swept["cancelled"] == 1 and swept["relaunched"] == 0
    with pytest.raises(WorkflowCancelled) as caught:
        await asyncio.wait_for(going, 60)
    async with get_client() as client:
        ended = (await client.read_flow_run(run.id)).state
    assert ended is not None and ended.type == StateType.CANCELLED, ended
    assert getattr(caught.value, "state", None) == ended  # what Prefect reports as its end
    assert "Cancelled by a person" in (ended.message or "")
    assert (await stored(coder_env, sim, wid)).state == WorkflowState.CANCELLED
    # Its step had made the chat but not checkpointed it yet: found by its label, archived.
    chats = [c for c in sim.chats() if c.labels.get(LABEL_WORKFLOW) == wid]
    assert len(chats) == 1 and sim.chat(chats[0].id).archived
    assert sent(sim, SECOND) == 0 and sent(sim, FIRST) == 1
