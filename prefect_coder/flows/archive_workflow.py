"""``archive_workflow``: archive a workflow's chat, once, when it is over."""

from collections.abc import Sequence

from prefect import flow

from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.operations import archive_workflow_chat


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
    return await archive_workflow_chat(
        workflow_id,
        tools,
        allow_plain_tools=allow_plain_tools,
        credentials=credentials,
        ledger=ledger,
    )
