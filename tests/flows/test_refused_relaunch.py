"""A crashed workflow whose relaunch is refused for its code (a finished step's prompt changed,
deployed without ``chat.patched``): the sweep does not relaunch it again on the same code, nor
count that relaunch against its limit, and carries it on once the deployment is deployed anew.

The runs come from a deployment of a flow defined here and are executed in this process
(``run_flow`` with the run Prefect made), as a worker would start them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.objects import FlowRun
from prefect.flow_engine import run_flow
from prefect.logging.handlers import APILogHandler

from coder_chat.durable.records import PromptChanged, WorkflowState
from coder_chat.simulator import Simulator
from prefect_coder import DurableChat
from prefect_coder.flows.orphan_sweep import orphan_sweep
from prefect_coder.operations import Runtime
from tests.names import REFUSED

from .support import run_logs

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.timeout(180)]

FIRST = "Read the pull request"
CHANGED = "Read the pull request, twice"
SECOND = "Write the review"
#: The deployed code: its first prompt, and whether it crashes after its first turn.
CODE: dict[str, Any] = {"first": FIRST, "crash": False}


class Crash(BaseException):
    """Stands for a killed process: the workflow's end never runs."""


@flow
async def reviewing(workflow_id: str) -> list[str]:
    async with DurableChat(workflow_id) as chat:
        await chat.turn(CODE["first"])
        if CODE["crash"]:
            raise Crash
        await chat.turn(SECOND)
    return [r.verdict for r in chat.results]


async def deploy() -> Any:
    return await (await reviewing.ato_deployment(name="reviewing")).aapply()


async def execute(run: FlowRun) -> Any:
    return await run_flow(reviewing, flow_run=run, parameters=run.parameters)  # type: ignore[arg-type,misc]


async def relaunches(workflow_id: str) -> list[FlowRun]:
    async with get_client() as client:
        return await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[f"prefect-coder:relaunch:{workflow_id}"])
            )
        )


async def sweep() -> dict[str, int]:
    return await orphan_sweep(target_deployment="reviewing", max_relaunches=1)


def sent(sim: Simulator, text: str) -> int:
    return sum(
        1
        for chat in sim.chats()
        for m in sim.messages(chat.id)
        if m.role == "user" and json.dumps(text)[1:-1] in json.dumps(m.content)
    )


async def test_a_refused_relaunch_waits_for_a_new_deployment(
    sim: Simulator, coder_env: Path
) -> None:
    wid = "review-505"
    CODE.update(first=FIRST, crash=True)
    deployment = await deploy()
    async with get_client() as client:
        first = await client.create_flow_run_from_deployment(
            deployment, parameters={"workflow_id": wid}
        )
    with pytest.raises(Crash):
        await execute(first)

    # Friday: the first prompt changes, deployed without a patch.
    CODE.update(first=CHANGED, crash=False)
    await deploy()
    assert (await sweep())["relaunched"] == 1
    [refused] = await relaunches(wid)
    with pytest.raises(PromptChanged):
        await execute(refused)
    async with get_client() as client:
        refused = await client.read_flow_run(refused.id)
    assert REFUSED in refused.tags

    # The same code again: no relaunch, and a pass that says why and what to do.
    state = await orphan_sweep(target_deployment="reviewing", max_relaunches=1, return_state=True)
    summary = await state.result()  # type: ignore[misc]
    assert summary["relaunched"] == 0 and len(await relaunches(wid)) == 1
    await APILogHandler.aflush()
    assert state.state_details.flow_run_id is not None
    async with get_client() as client:
        said = [log.message for log in await run_logs(client, state.state_details.flow_run_id)]
    assert any(f"relaunch {refused.name!r} was refused" in line for line in said), said
    workflow = await Runtime.from_blocks().store.get_workflow(str(sim.organization_id), wid)
    assert workflow is not None and workflow.state == WorkflowState.RUNNING
    assert workflow.flow_run_id == str(first.id)  # left as it was

    # Monday: the code it ran is deployed again. The refused relaunch did not count against
    # the limit (one relaunch): the workflow is carried on to its end.
    CODE.update(first=FIRST)
    await deploy()
    assert (await sweep())["relaunched"] == 1
    [carried] = [r for r in await relaunches(wid) if r.id != refused.id]
    assert await execute(carried) == ["stored", "ran"]
    workflow = await Runtime.from_blocks().store.get_workflow(str(sim.organization_id), wid)
    assert workflow is not None and workflow.state == WorkflowState.FINISHED
    assert sent(sim, FIRST) == 1 and sent(sim, CHANGED) == 0 and sent(sim, SECOND) == 1
