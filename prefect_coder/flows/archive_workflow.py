"""``archive_workflow``: archive a workflow's chat, once, when it is over."""

from collections.abc import Sequence

from prefect import flow

from coder_chat.durable.records import WorkflowState
from prefect_coder._run.imports import resolve_tools
from prefect_coder._run.naming import deployment_name
from prefect_coder._run.runtime import Runtime
from prefect_coder._run.workflow import Workflow, WorkflowRun, finish_workflow, take_epoch
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.settings import WorkflowSettings
from prefect_coder.tasks.lifecycle import archive_chat


@flow(name="archive-workflow", flow_run_name="archive {workflow_id}")
async def archive_workflow(
    workflow_id: str,
    tools: Sequence[str] = (),
    allow_plain_tools: bool = False,
    credentials: CoderCredentials | None = None,
    ledger: SqliteLedger | PostgresLedger | None = None,
) -> bool:
    """Archive the chat of ``workflow_id``; a paused client tool is reconciled first.

    Taking the workflow's epoch first means a run still acting for it is fenced
    out before its chat is archived. Returns whether a chat was archived.
    """
    settings = WorkflowSettings(allow_plain_tools=allow_plain_tools)
    workflow = Workflow(
        workflow_id,
        deployment=await deployment_name(),
        flow_run_id=None,
        credentials=credentials,
        ledger=ledger,
        settings=settings,
        tools=resolve_tools(tools, allow_plain=allow_plain_tools),
    )
    rt = Runtime.from_blocks(credentials, ledger)
    run = WorkflowRun(workflow, await take_epoch(rt, workflow), rt)
    archived = await archive_chat(run)
    await finish_workflow(run, WorkflowState.FINISHED)
    return archived
