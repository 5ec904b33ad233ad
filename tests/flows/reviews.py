"""The review flow of the cancel and resume tests: two turns, and code a test changes between runs."""

from __future__ import annotations

from typing import Any

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.objects import FlowRun
from prefect.flow_engine import run_flow

from coder_chat.durable.records import WorkflowRecord
from coder_chat.simulator import Simulator
from prefect_coder import DurableChat
from prefect_coder.operations import Runtime
from prefect_coder.settings import WorkflowSettings

FIRST = "Read the pull request"


SECOND = "Write the review"


#: What the flow's code does after its first turn; a test "fixes the code" by changing it.
AFTER_FIRST = {"do": "go on"}


class Crash(BaseException):
    """Stands for a killed process: the workflow's end never runs."""


@flow
async def review(workflow_id: str, settings: WorkflowSettings | None = None) -> list[str]:
    async with DurableChat(workflow_id, settings=settings) as chat:
        await chat.turn(FIRST)
        if AFTER_FIRST["do"] == "crash":
            raise Crash
        if AFTER_FIRST["do"] == "fail":
            raise RuntimeError("the review's own code is broken")
        await chat.turn(SECOND)
    return [r.verdict for r in chat.results]


async def deploy(name: str) -> Any:
    """The review flow deployed under ``name`` (its first step set to go on)."""
    AFTER_FIRST["do"] = "go on"
    return await (await review.ato_deployment(name=name)).aapply()


async def run_from_deployment(
    deployment_id: Any, workflow_id: str, settings: dict[str, Any] | None = None
) -> FlowRun:
    parameters: dict[str, Any] = {"workflow_id": workflow_id}
    if settings is not None:
        parameters["settings"] = settings
    async with get_client() as client:
        return await client.create_flow_run_from_deployment(deployment_id, parameters=parameters)


async def execute(run: FlowRun) -> Any:
    """Run a flow run of the deployment here, as a worker would."""
    return await run_flow(review, flow_run=run, parameters=run.parameters)  # type: ignore[arg-type,misc]


async def stored(sim: Simulator, workflow_id: str) -> WorkflowRecord:
    workflow = await Runtime.from_blocks().store.get_workflow(str(sim.organization_id), workflow_id)
    assert workflow is not None
    return workflow


async def crashed_run(deployment_id: Any, workflow_id: str) -> FlowRun:
    """A run of the deployment whose process dies after the first step (``Crash``), its
    workflow left running in the store; the next run goes on."""
    AFTER_FIRST["do"] = "crash"
    run = await run_from_deployment(deployment_id, workflow_id)
    with pytest.raises(Crash):
        await execute(run)
    AFTER_FIRST["do"] = "go on"
    return run


async def runs_tagged(tag: str) -> list[FlowRun]:
    async with get_client() as client:
        return await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag]))
        )
