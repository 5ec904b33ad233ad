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
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.client.schemas.objects import StateType

from coder_chat.durable.records import WorkflowState
from coder_chat.simulator import Simulator
from prefect_coder.exceptions import WorkflowOverBudget
from prefect_coder.flows.durable_chats import WorkflowSpec, durable_chats
from prefect_coder.flows.orphan_sweep import orphan_sweep
from prefect_coder.operations import Runtime, resume_workflow
from prefect_coder.settings import WorkflowSettings
from tests.lab.truth import committed_usage
from tests.names import workflow_tag

from .reviews import SECOND, deploy, execute, run_from_deployment, runs_tagged, stored
from .support import run_logs, sent, task_runs_of

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
        said = [g.message for g in await run_logs(client, run.id) if g.task_run_id is None]
    assert ended.state is not None and ended.state.type == StateType.CANCELLED
    assert ended.state.name == "Over budget", ended.state
    # Prefect's own last word on the run is the state it ended in, not the Running it last knew.
    finished = [m for m in said if m.startswith("Finished in state ")]
    assert finished and finished[-1].startswith("Finished in state Over budget("), finished
    if not settings:  # Coder's limit: the step whose send Coder refused is a task that failed
        return ended.state.message or ""
    # Its own budget: the step it did not take has no task run (a person would read it failed).
    async with get_client() as client:
        tasks = await task_runs_of(client, run.id)
    assert [t.state_type for t in tasks] == [StateType.COMPLETED] * len(tasks), tasks
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
    assert (
        f"resume it with a higher limit (prefect-coder workflows resume {wid} --max-turns" in said
    )
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
    assert (
        f"resume it once Coder's limit has reset or been raised (prefect-coder workflows resume {wid})"
        in said
    )
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


async def test_a_fleet_counts_its_workflows_over_budget_apart_and_goes_on(
    sim: Simulator, coder_env: Path
) -> None:
    specs = [WorkflowSpec(workflow_id=f"capped-{i}", prompts=["plan it", "do it"]) for i in (1, 2)]
    state = await durable_chats(
        workflows=specs, settings=WorkflowSettings(max_turns=1), return_state=True
    )
    assert state.is_completed(), state  # over budget is an end, not a failure
    run_id = state.state_details.flow_run_id
    assert run_id is not None
    async with get_client() as client:
        said = [g.message for g in await run_logs(client, run_id)]
        [progress] = [
            a
            for a in await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
            )
            if a.type == "progress"
        ]
    assert "0 of 2 workflow(s) finished, 0 failed, 2 over budget." in said, said
    lines = (progress.description or "").splitlines()
    for i in (1, 2):
        assert f"- capped-{i}: over budget (it finished 1 turn(s), its limit is 1 " in "\n".join(
            lines
        ), lines
    chats = [
        c for c in sim.chats() if c.labels.get("prefect-coder/workflow", "").startswith("capped")
    ]
    assert lines[-1] == f"In all, the workflows used {committed_usage(chats).describe()}."
    assert all(c.archived for c in chats) and len(chats) == 2
