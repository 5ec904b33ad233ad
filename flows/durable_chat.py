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
from collections.abc import Awaitable, Sequence
from typing import Any, cast

from prefect import Flow, flow
from prefect.client.schemas.objects import FlowRun, State
from prefect.runtime import deployment as current_deployment
from prefect.runtime import flow_run as current_flow_run

from blocks import CoderCredentials, PostgresLedger, SqliteLedger
from coder_chat.durable.records import WorkflowState
from coder_chat.durable.step import StepResult
from tasks import archive_chat, run_turn
from tasks._runtime import run_log
from tasks.lifecycle import FailedWorkflow, end_failed_workflow
from tasks.runs import Progress
from tasks.settings import WorkflowSettings
from tasks.turns import VERDICT_WORDS
from tasks.workflow import begin_workflow, finish_workflow, heartbeat_forever, publish_transcript

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
    log = run_log()
    deployment = current_deployment.name or "local"
    flow_run_id = current_flow_run.id
    began = await begin_workflow(
        workflow_id,
        deployment,
        flow_run_id,
        credentials,
        ledger,
        archive_at_end=settings.archive_at_end,
    )
    if flow_run_id:
        _RUNNING[flow_run_id] = FailedWorkflow(
            workflow_id, flow_run_id, tools, settings, credentials, ledger
        )
    progress = Progress(workflow_id, len(prompts), began.took_over_from)
    await progress.start()
    beat = asyncio.create_task(
        heartbeat_forever(workflow_id, began.epoch, settings.heartbeat_seconds, credentials, ledger)
    )
    try:
        for step, prompt in enumerate(prompts, start=1):
            # An async task called with return_state gives a coroutine of its state
            # (Prefect's overloads say State; the runtime says otherwise).
            call = run_turn(
                tenant=began.tenant,
                workflow_id=workflow_id,
                step=step,
                steps=len(prompts),
                prompt=prompt,
                epoch=began.epoch,
                tools=tools,
                output_schema=output_schemas[step - 1] if step <= len(output_schemas) else "",
                settings=settings,
                deployment=deployment,
                declare_structured_output=any(output_schemas),
                credentials=credentials,
                ledger=ledger,
                return_state=True,
            )
            state = await cast(Awaitable[State[StepResult]], call)
            result = await state.aresult()
            if state.name == "Cached":  # Prefect's cache answered: nothing ran this time
                result = result.model_copy(update={"verdict": "cached"})
                log.info(f"Step {step} of {len(prompts)}: cached ({VERDICT_WORDS['cached']}).")
            await progress.step_done(result)
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
    await publish_transcript(workflow_id, progress.results, credentials, ledger)
    if settings.archive_at_end:
        await archive_chat(
            workflow_id=workflow_id,
            epoch=began.epoch,
            tools=tools,
            settings=settings,
            credentials=credentials,
            ledger=ledger,
        )
    await finish_workflow(workflow_id, began.epoch, WorkflowState.FINISHED, credentials, ledger)
    _RUNNING.pop(flow_run_id or "", None)
    log.info(f"Workflow {workflow_id} is finished: {_tally(progress.results)}.")
    return progress.results


def _tally(results: list[StepResult]) -> str:
    counts: dict[str, int] = {}
    for result in results:
        counts[result.verdict] = counts.get(result.verdict, 0) + 1
    return f"{len(results)} step(s), " + ", ".join(f"{n} {v}" for v, n in counts.items())
