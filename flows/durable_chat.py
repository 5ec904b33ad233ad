"""``durable_chat``: one Coder chat, step by step, that survives crashes of the process running it.

Launch it from the Prefect UI (or ``durable_chat(...)`` in Python) with a
``workflow_id`` of your choosing. Re-running the same ``workflow_id`` after a
crash resumes it, on any machine: finished steps come from the store (or
Prefect's result cache, where it has them), an interrupted step is recovered or
safely resubmitted, and the dead run can never act again (each run takes a new
fencing epoch in the store).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect import Flow, flow
from prefect.client.schemas.objects import FlowRun, State
from prefect.runtime import deployment as current_deployment
from prefect.runtime import flow_run as current_flow_run

from coder_chat.durable.step import StepResult
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.flows._workflow import Where, Workflow, begin, run_workflow, tally
from prefect_coder.tasks._runtime import run_log
from prefect_coder.tasks.lifecycle import FailedWorkflow, end_failed_workflow
from prefect_coder.tasks.runs import Progress
from prefect_coder.tasks.settings import WorkflowSettings

#: Frozen, so one instance serves as every call's default.
DEFAULT_SETTINGS = WorkflowSettings()

#: What the failure hook needs of each workflow running in this process, by flow run id
#: (the hook sees the run's parameters only as the API stored them, blocks as references).
_RUNNING: dict[str, FailedWorkflow] = {}


async def _end_failed_workflow(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:
    """A definitive failure ends the workflow: archive its chat if asked, mark it FAILED.

    Never on Crashed or Cancelled: the sweep relaunches those.
    """
    log = run_log()
    failed = _RUNNING.pop(str(flow_run.id), None)
    if failed is None:
        log.warning("The run failed before it began its workflow; nothing to record.")
        return
    try:
        await end_failed_workflow(failed, log)
    except Exception as exc:  # noqa: BLE001 - a hook must report, not raise over the failure
        log.error(f"Could not record the end of workflow {failed.workflow_id}: {exc}")


@flow(name="durable-chat", on_failure=[_end_failed_workflow])
async def durable_chat(
    workflow_id: str,
    prompts: list[str],
    tools: Sequence[str] = (),
    output_schemas: Sequence[str] = (),
    credentials: CoderCredentials | None = None,
    ledger: SqliteLedger | PostgresLedger | None = None,
    settings: WorkflowSettings = DEFAULT_SETTINGS,
) -> list[StepResult]:
    """Run ``prompts`` as the steps of one durable Coder chat.

    Args:
        workflow_id: Your name for this workflow; run it again to resume after a crash.
        prompts: One prompt per step, run in order on the same chat.
        tools: Client tools as import paths (``module:function``): durable tools
            (``@durable_tool``), or plain async functions if the settings allow them.
        output_schemas: Per step, the import path of a pydantic model for a structured
            answer; empty (or missing) for a text answer.
        credentials: Saved Coder credentials (none: CODER_URL, CODER_SESSION_TOKEN and
            CODER_ORG_ID from the worker's environment).
        ledger: Where progress is stored (none: the embedded SQLite store).
        settings: The chat's setup and each step's time limits.
    """
    wf = Workflow(workflow_id, prompts, tools, output_schemas, credentials, ledger, settings)
    where = Where(current_flow_run.id, current_deployment.name or "local")
    began = await begin(wf, where)
    if where.flow_run_id:
        _RUNNING[where.flow_run_id] = wf.failed(where.flow_run_id)
    progress = Progress(workflow_id, len(prompts), took_over_from=began.took_over_from)
    await progress.start()
    results = await run_workflow(wf, where, began, progress)
    _RUNNING.pop(where.flow_run_id or "", None)
    run_log().info(f"Workflow {workflow_id} is finished: {tally(results)}.")
    return results
