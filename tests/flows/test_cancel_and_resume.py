"""A person cancels a workflow whose run is gone, and resumes one that failed or was
cancelled: ``prefect_coder.operations``, as ``prefect-coder workflows cancel|resume`` call it.

The runs come from a deployment of a flow defined here and are executed in this process
(``run_flow`` with the run Prefect made), so the resumed run is the deployment's own run,
with its parameters, as a worker would start it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.states import Crashed, Running

from coder_chat import CoderConfigError
from coder_chat.durable.context import StepTools
from coder_chat.durable.records import WorkflowState
from coder_chat.durable.store import DurableStore
from coder_chat.simulator import Simulator
from prefect_coder.operations import Runtime, cancel_workflow, resume_workflow
from tests.names import workflow_tag

from .reviews import (
    AFTER_FIRST,
    FIRST,
    SECOND,
    crashed_run,
    deploy,
    execute,
    run_from_deployment,
    runs_tagged,
    stored,
)
from .support import sent

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.timeout(120)]


@pytest.fixture
async def deployment(coder_env: Path) -> Any:
    return await deploy("reviews")


def store_of(sim: Simulator) -> tuple[DurableStore, str]:
    return Runtime.from_blocks().store, str(sim.organization_id)


async def test_a_cancelled_workflow_whose_run_is_gone_is_resumed_to_its_end(
    sim: Simulator, deployment: Any
) -> None:
    wid = "review-303"
    await crashed_run(deployment, wid)
    lines: list[str] = []
    cancelled = await cancel_workflow(Runtime.from_blocks(), wid, StepTools(), lines.append)
    workflow = await stored(sim, wid)
    assert workflow.state == WorkflowState.CANCELLED and workflow.chat_id is not None
    assert [c.action for c in cancelled.chats] == ["archived"]
    assert sim.chat(workflow.chat_id).archived
    with pytest.raises(CoderConfigError, match="not running"):
        await cancel_workflow(Runtime.from_blocks(), wid, StepTools(), lines.append)

    resumed = await resume_workflow(*store_of(sim), wid)
    assert await execute(resumed) == ["stored", "ran"]
    workflow = await stored(sim, wid)
    assert workflow.state == WorkflowState.FINISHED and workflow.epoch == 3
    assert sent(sim, FIRST) == 1 and sent(sim, SECOND) == 1  # nothing finished sent again
    assert len(sim.chats()) == 1  # the same conversation, reopened, then archived at the end
    # Every run of the workflow is found by its tag.
    assert {r.id for r in await runs_tagged(workflow_tag(wid))} >= {resumed.id}
    assert len(await runs_tagged(workflow_tag(wid))) == 2


async def test_a_failed_workflow_is_resumed_once_its_code_is_fixed(
    sim: Simulator, deployment: Any
) -> None:
    wid = "review-404"
    AFTER_FIRST["do"] = "fail"
    with pytest.raises(RuntimeError, match="broken"):
        await execute(await run_from_deployment(deployment, wid))
    assert (await stored(sim, wid)).state == WorkflowState.FAILED
    with pytest.raises(CoderConfigError, match="no workflow 'nothing-of-that-name'"):
        await resume_workflow(*store_of(sim), "nothing-of-that-name")
    AFTER_FIRST["do"] = "go on"  # the fix is deployed
    assert await execute(await resume_workflow(*store_of(sim), wid)) == ["stored", "ran"]
    assert (await stored(sim, wid)).state == WorkflowState.FINISHED
    assert sent(sim, FIRST) == 1 and sent(sim, SECOND) == 1


async def test_a_stranded_workflow_is_resumed_and_a_live_one_is_not(
    sim: Simulator, deployment: Any
) -> None:
    """A workflow left running by a run that ended (the sweep gave up relaunching it, say)
    is resumed; one whose run is still going is refused, in words."""
    wid = "review-505"
    crashed = await crashed_run(deployment, wid)
    assert (await stored(sim, wid)).state == WorkflowState.RUNNING
    resumed = await resume_workflow(*store_of(sim), wid)
    async with get_client() as client:  # as if its worker had taken it up: Running
        await client.set_flow_run_state(crashed.id, Running(), force=True)
    with pytest.raises(CoderConfigError, match="is running: its flow run"):
        await resume_workflow(*store_of(sim), wid)
    async with get_client() as client:
        await client.set_flow_run_state(crashed.id, Crashed(), force=True)
    assert await execute(resumed) == ["stored", "ran"]
    assert (await stored(sim, wid)).state == WorkflowState.FINISHED
    assert sent(sim, FIRST) == 1 and sent(sim, SECOND) == 1
