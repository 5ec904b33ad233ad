"""A workflow past a limit of its budget, or of Coder's usage limit, ends over budget:
its run *Cancelled: Over budget* saying which limit, its chat archived, nothing
relaunched; a resume with a higher budget carries it on (issue 27).

The runs come from a deployment of the review flow (two turns), executed in this
process as a worker would execute them; the sweep is the orphan_sweep flow itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType

from coder_chat.durable.records import WorkflowState
from coder_chat.simulator import Simulator
from prefect_coder.exceptions import WorkflowOverBudget
from prefect_coder.flows.orphan_sweep import orphan_sweep
from prefect_coder.operations import Runtime, resume_workflow
from tests.names import workflow_tag

from .reviews import SECOND, deploy, execute, run_from_deployment, runs_tagged, stored
from .support import sent

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.timeout(120)]


@pytest.fixture
async def deployment(coder_env: Path) -> Any:
    return await deploy("budgeted")


async def ended_over_budget(deployment: Any, wid: str, settings: dict[str, Any]) -> str:
    """Run the deployment for ``wid``; it ends over budget. Returns its run's message."""
    run = await run_from_deployment(deployment, wid, settings)
    with pytest.raises(WorkflowOverBudget):
        await execute(run)
    async with get_client() as client:
        ended = await client.read_flow_run(run.id)
    assert ended.state is not None and ended.state.type == StateType.CANCELLED
    assert ended.state.name == "Over budget", ended.state
    rt = Runtime.from_blocks()
    workflow = await rt.store.get_workflow(rt.tenant, wid)
    assert workflow is not None and workflow.state == WorkflowState.OVER_BUDGET
    return ended.state.message or ""


async def test_a_turn_budget_stops_the_workflow_and_a_resume_with_more_finishes_it(
    sim: Simulator, deployment: Any
) -> None:
    wid = "review-budget"
    said = await ended_over_budget(deployment, wid, {"max_turns": 1})
    assert "it finished 1 turn(s), its limit is 1 (max_turns)" in said, said
    assert "resume it with a higher limit" in said
    workflow = await stored(sim, wid)
    assert workflow.chat_id is not None and sim.chat(workflow.chat_id).archived
    assert sent(sim, SECOND) == 0

    rt = Runtime.from_blocks()
    resumed = await resume_workflow(rt.store, rt.tenant, wid, {"max_turns": 2})
    assert resumed.parameters["settings"]["max_turns"] == 2
    assert await execute(resumed) == ["stored", "ran"]
    assert (await stored(sim, wid)).state == WorkflowState.FINISHED
    assert sent(sim, SECOND) == 1 and len(sim.chats()) == 1  # the same chat, reopened


async def test_coders_usage_limit_stops_it_with_coders_figures_and_nothing_relaunches_it(
    sim: Simulator, deployment: Any
) -> None:
    wid = "review-coder-limit"
    sim.config.cost_micros_per_token = 1000
    sim.config.usage_limit_micros = 1  # the first turn passes it: the second is refused
    said = await ended_over_budget(deployment, wid, {})
    assert "Coder's usage limit is reached (spent $" in said, said
    assert " of $0.0000; it resets at " in said
    refused = [r for r in sim.records.requests if r.route == "send_message"]
    assert [r.status for r in refused] == [409]  # refused once, never sent again
    assert sent(sim, SECOND) == 0

    # The sweep, even with every heartbeat stale, leaves it alone: it is not running.
    swept = await orphan_sweep(
        target_deployment="local", stale_heartbeat_seconds=0.0, self_heal=False
    )
    assert swept["stranded"] == 0 and swept["relaunched"] == 0, swept
    assert len(await runs_tagged(workflow_tag(wid))) == 1
    assert [r.status for r in sim.records.requests if r.route == "send_message"] == [409]
