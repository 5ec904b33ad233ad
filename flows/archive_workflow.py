"""``archive_workflow``: archive a workflow's chat, once, when it is over."""

from __future__ import annotations

from prefect import flow
from prefect.runtime import deployment as current_deployment
from prefect.runtime import flow_run as current_flow_run

from coder_chat.durable.records import WorkflowState
from tasks import archive_chat
from tasks.workflow import begin_workflow, finish_workflow


@flow(name="archive-workflow")
async def archive_workflow(
    workflow_id: str,
    tools: list[str] | None = None,
    allow_plain_tools: bool = False,
    credentials_block: str | None = None,
    ledger_block: str | None = None,
) -> bool:
    """Archive the chat of ``workflow_id``; a paused client tool is reconciled first.

    Taking the workflow's epoch first means a run still acting for it is fenced
    out before its chat is archived. Returns whether a chat was archived.
    """
    deployment = current_deployment.name or "local"
    _, epoch = await begin_workflow(
        workflow_id, deployment, current_flow_run.id, credentials_block, ledger_block
    )
    archived = await archive_chat(
        workflow_id=workflow_id,
        epoch=epoch,
        tools=tools,
        allow_plain_tools=allow_plain_tools,
        credentials_block=credentials_block,
        ledger_block=ledger_block,
    )
    await finish_workflow(
        workflow_id, epoch, WorkflowState.FINISHED, credentials_block, ledger_block
    )
    return archived
