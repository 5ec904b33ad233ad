"""A person cancels a workflow's run in the UI, the sweep ends the workflow, and later the
person presses *Retry* on that cancelled run: the retry is a resume. The same flow run runs
again, takes the workflow over from the store, and finishes it; nothing finished is sent
again, and the sweep leaves the retried run alone while it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.states import AwaitingRetry, Cancelled

from coder_chat.durable.records import WorkflowState
from coder_chat.simulator import Simulator
from prefect_coder.flows.orphan_sweep import orphan_sweep

from .reviews import FIRST, SECOND, crashed_run, deploy, execute, stored
from .support import sent

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.timeout(120)]

#: A name no other test deploys: the sweep finds runs by their deployment's name.
DEPLOYMENT = "reviews-retried"


@pytest.fixture
async def deployment(coder_env: Path) -> Any:
    return await deploy(DEPLOYMENT)


async def test_retry_on_a_cancelled_run_resumes_its_workflow(
    sim: Simulator, deployment: Any
) -> None:
    wid = "review-606"
    run = await crashed_run(deployment, wid)  # killed by the worker, on the person's cancel
    async with get_client() as client:
        await client.set_flow_run_state(run.id, Cancelled(), force=True)
    assert (await orphan_sweep(target_deployment=DEPLOYMENT))["cancelled"] == 1
    workflow = await stored(sim, wid)
    assert workflow.state == WorkflowState.CANCELLED and workflow.chat_id is not None
    assert sim.chat(workflow.chat_id).archived

    # Retry, as the UI's button does it: the cancelled run is scheduled to run again.
    async with get_client() as client:
        await client.set_flow_run_state(run.id, AwaitingRetry(), force=True)
        run = await client.read_flow_run(run.id)
    assert await execute(run) == ["stored", "ran"]
    workflow = await stored(sim, wid)
    assert workflow.state == WorkflowState.FINISHED and workflow.epoch == 3
    assert workflow.chat_id is not None
    assert workflow.flow_run_id == str(run.id)
    assert sent(sim, FIRST) == 1 and sent(sim, SECOND) == 1
    assert len(sim.chats()) == 1  # the same conversation, reopened, then archived at its end
    assert sim.chat(workflow.chat_id).archived
    # The sweep after finds nothing to end or relaunch.
    summary = await orphan_sweep(target_deployment=DEPLOYMENT)
    assert summary["cancelled"] == 0 and summary["relaunched"] == 0
