"""The end of a workflow: ``archive_chat``, and ending one that failed for good."""

from __future__ import annotations

from prefect_coder._run.ending import retire_workflow_chat
from prefect_coder._run.logs import run_log
from prefect_coder._run.task_policy import durable_task
from prefect_coder._run.workflow import WorkflowRun


@durable_task(name="archive-chat", task_run_name="archive {run.workflow_id}")
async def archive_chat(run: WorkflowRun) -> bool:
    """Archive the workflow's chat, once: a paused tool is answered from the ledger first.

    Returns whether the chat is archived (``False`` when the workflow never made one).
    Already archived counts as done.
    """
    retired = await retire_workflow_chat(run, run_log().info)
    return retired is not None and retired.done
