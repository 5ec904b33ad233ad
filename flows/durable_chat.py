"""``durable_chat``: one Coder chat, step by step, that survives crashes of the process running it.

Launch it from the Prefect UI (or ``durable_chat(...)`` in Python) with a
``workflow_id`` of your choosing. Re-running the same ``workflow_id`` after a
crash resumes it, on any machine: finished steps come from the store (or
Prefect's result cache, where it has them), an interrupted step is recovered or
safely resubmitted, and the dead run can never act again (each run takes a new
fencing epoch in the store).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, cast

from prefect import Flow, flow, get_run_logger
from prefect.client.schemas.objects import FlowRun, State
from prefect.runtime import deployment as current_deployment
from prefect.runtime import flow_run as current_flow_run

from coder_chat.durable.context import DurableOptions
from coder_chat.durable.records import WorkflowState
from coder_chat.durable.step import StepResult
from tasks import archive_chat, run_turn
from tasks.lifecycle import end_failed_workflow
from tasks.workflow import begin_workflow, finish_workflow, heartbeat_forever, publish_transcript


async def _end_failed_workflow(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:
    """A definitive failure ends the workflow: archive its chat if asked, mark it FAILED.

    Never on Crashed or Cancelled: the sweep relaunches those.
    """
    params = flow_run.parameters
    log = get_run_logger()
    try:
        await end_failed_workflow(
            params, str(flow_run.id), log, archive=params.get("archive_at_end", True)
        )
    except Exception as exc:  # noqa: BLE001 - a hook must report, not raise over the failure
        log.error(f"Could not record the end of workflow {params.get('workflow_id')}: {exc}")


@flow(name="durable-chat", on_failure=[_end_failed_workflow])
async def durable_chat(
    workflow_id: str,
    prompts: list[str],
    tools: list[str] | None = None,
    allow_plain_tools: bool = False,
    output_schemas: list[str | None] | None = None,
    system_prompt: str | None = None,
    model: str | None = None,
    workspace_id: str | None = None,
    mcp_server_ids: list[str] | None = None,
    credentials_block: str | None = None,
    ledger_block: str | None = None,
    request_timeout: float = 300.0,
    step_deadline: float = 600.0,
    archive_at_end: bool = True,
    heartbeat_interval: float = 30.0,
) -> list[StepResult]:
    """Run ``prompts`` as the steps of one durable Coder chat.

    Args:
        workflow_id: Your name for this workflow; re-run it to resume after a crash.
        prompts: One prompt per step, run in order on the same chat.
        tools: Client tools as import paths (``module:function``); durable tools
            (``@durable_tool``) unless ``allow_plain_tools`` is set.
        allow_plain_tools: Accept plain async functions as tools. Their effects
            may run again after a crash.
        output_schemas: Per step, the import path of a pydantic model for a
            structured answer, or null for text.
        system_prompt: The chat's system prompt.
        model: A model hint (config id, ``provider:model``, or a display name).
        workspace_id: A Coder workspace to bind the chat to.
        mcp_server_ids: MCP server configs the chat may use.
        credentials_block: A saved CoderCredentials block (default: CODER_URL,
            CODER_SESSION_TOKEN, CODER_ORG_ID).
        ledger_block: A saved ledger block, ``slug/name`` or a SqliteLedger name
            (default: the embedded SQLite store, PREFECT_CODER_SQLITE_PATH).
        request_timeout: Seconds each segment of a turn may take.
        step_deadline: Seconds a whole step's turn may take.
        archive_at_end: Archive the chat when the workflow ends (or definitively fails).
        heartbeat_interval: Seconds between heartbeats the orphan sweep watches.
    """
    log = get_run_logger()
    deployment = current_deployment.name or "local"
    tenant, epoch = await begin_workflow(
        workflow_id,
        deployment,
        current_flow_run.id,
        credentials_block,
        ledger_block,
        archive_at_end=archive_at_end,
    )
    beat = asyncio.create_task(
        heartbeat_forever(workflow_id, epoch, heartbeat_interval, credentials_block, ledger_block)
    )
    # A run a crash left live gets the step's own budget to finish before it is cut.
    options = DurableOptions(
        request_timeout=request_timeout, step_deadline=step_deadline, settle_timeout=step_deadline
    )
    schemas = list(output_schemas or [])
    results: list[StepResult] = []
    try:
        for step, prompt in enumerate(prompts, start=1):
            # An async task called with return_state gives a coroutine of its state
            # (Prefect's overloads say State; the runtime says otherwise).
            call = run_turn(
                tenant=tenant,
                workflow_id=workflow_id,
                step=step,
                prompt=prompt,
                epoch=epoch,
                tools=tools,
                allow_plain_tools=allow_plain_tools,
                output_schema=schemas[step - 1] if step <= len(schemas) else None,
                system_prompt=system_prompt,
                model=model,
                workspace_id=workspace_id,
                mcp_server_ids=mcp_server_ids,
                deployment=deployment,
                declare_structured_output=any(schemas),
                credentials_block=credentials_block,
                ledger_block=ledger_block,
                options=options,
                return_state=True,
            )
            state = await cast(Awaitable[State[StepResult]], call)
            result = await state.aresult()
            if state.name == "Cached":  # Prefect's cache answered: nothing ran this time
                result = result.model_copy(update={"verdict": "cached"})
            results.append(result)
            log.info(f"step {step}/{len(prompts)}: {result.verdict}")
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
    await publish_transcript(workflow_id, results, credentials_block, ledger_block)
    if archive_at_end:
        await archive_chat(
            workflow_id=workflow_id,
            epoch=epoch,
            tools=tools,
            allow_plain_tools=allow_plain_tools,
            credentials_block=credentials_block,
            ledger_block=ledger_block,
            options=options,
        )
    await finish_workflow(
        workflow_id, epoch, WorkflowState.FINISHED, credentials_block, ledger_block
    )
    return results
