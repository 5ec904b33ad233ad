"""``reconcile_chat``, ``archive_chat`` and the end of a failed workflow."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prefect import task
from prefect.logging.loggers import LoggingAdapter

from coder_chat import ChatClient, CoderError
from coder_chat.durable.context import DurableOptions, StepContext, StepTools
from coder_chat.durable.records import Fence, WorkflowState
from coder_chat.durable.retire import Retired, retire_chat
from coder_chat.durable.step import StepSpec, recover
from coder_chat.durable.store import DurableStore
from prefect_coder.blocks import CoderCredentials
from prefect_coder.tasks._runtime import (
    RETRY_DELAYS,
    Ledger,
    import_model,
    import_tools,
    retry_if_transient,
    run_log,
    runtime,
    with_retries,
)
from prefect_coder.tasks.settings import WorkflowSettings


@task(
    name="reconcile-chat",
    task_run_name="reconcile {workflow_id} step {step}",
    retries=len(RETRY_DELAYS),
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_if_transient,
)
async def reconcile_chat(
    workflow_id: str,
    step: int,
    epoch: int,
    tools: Sequence[str] = (),
    output_schema: str = "",
    settings: WorkflowSettings | None = None,
    credentials: CoderCredentials | None = None,
    ledger: Ledger | None = None,
) -> str:
    """Settle the workflow's chat and say whether step ``step`` finished (never resubmits).

    Returns ``"recovered"`` (the attempt finished; its result is in history),
    ``"unfinished"`` (a re-run would resubmit) or ``"no-chat"``.
    """
    log = run_log()
    settings = settings or WorkflowSettings()
    output_type = import_model(output_schema)
    step_tools = StepTools.build(
        import_tools(tools), allow_plain=settings.allow_plain_tools, output_type=output_type
    )
    rt = runtime(credentials, ledger)
    workflow = await rt.store.get_workflow(rt.tenant, workflow_id)
    if workflow is None or workflow.chat_id is None:
        log.info(f"Workflow {workflow_id} has no chat; nothing to reconcile.")
        return "no-chat"
    fence = Fence(tenant=rt.tenant, workflow_id=workflow_id, epoch=epoch)
    ctx = StepContext(
        rt.client, rt.store, fence, workflow_id, step, step_tools, settings.options(), log.info
    )
    recovered = await recover(
        ctx, StepSpec(prompt="", output_type=output_type), workflow.chat_id, "hard_crash"
    )
    verdict = "unfinished" if recovered is None else "recovered"
    log.info(f"Step {step} of {workflow_id} is {verdict}.")
    return verdict


@task(
    name="archive-chat",
    task_run_name="archive {workflow_id}",
    retries=len(RETRY_DELAYS),
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_if_transient,
)
async def archive_chat(
    workflow_id: str,
    epoch: int,
    tools: Sequence[str] = (),
    settings: WorkflowSettings | None = None,
    credentials: CoderCredentials | None = None,
    ledger: Ledger | None = None,
) -> bool:
    """Archive the workflow's chat, once: a paused tool is answered from the ledger first.

    Returns whether the chat is archived (``False`` when the workflow never made one).
    Already archived counts as done.
    """
    log = run_log()
    settings = settings or WorkflowSettings()
    step_tools = StepTools.build(import_tools(tools), allow_plain=settings.allow_plain_tools)
    rt = runtime(credentials, ledger)
    fence = Fence(tenant=rt.tenant, workflow_id=workflow_id, epoch=epoch)
    retired = await retire_workflow_chat(
        rt.client, rt.store, fence, step_tools, settings.options(), log.info
    )
    return retired is not None and retired.done


async def retire_workflow_chat(
    client: ChatClient,
    store: DurableStore,
    fence: Fence,
    tools: StepTools,
    options: DurableOptions,
    report: Callable[[str], None],
) -> Retired | None:
    """Retire the chat the workflow's checkpoint points at; ``None`` when it has none."""
    workflow = await store.get_workflow(fence.tenant, fence.workflow_id)
    if workflow is None or workflow.chat_id is None:
        report(f"Workflow {fence.workflow_id} never created a chat; nothing to archive.")
        return None
    chat_id = workflow.chat_id
    record = await store.get_chat(fence.tenant, chat_id)
    step = _step_of(record.journal.marker if record and record.journal else "")
    ctx = StepContext(client, store, fence, fence.workflow_id, step, tools, options, report)
    retired = await retire_chat(ctx, chat_id)
    if retired.done:
        report(f"Chat {chat_id} of workflow {fence.workflow_id} is {retired.action}.")
    else:
        report(f"Chat {chat_id} of workflow {fence.workflow_id} was left paused: {retired.detail}")
    return retired


@dataclass(frozen=True)
class FailedWorkflow:
    """What the failure hook knows of a workflow whose run failed for good."""

    workflow_id: str
    flow_run_id: str
    tools: Sequence[str] = ()
    settings: WorkflowSettings = field(default_factory=WorkflowSettings)
    credentials: CoderCredentials | None = None
    ledger: Ledger | None = None


async def end_failed_workflow(failed: FailedWorkflow, log: LoggingAdapter) -> None:
    """A workflow's run failed for good: archive its chat if asked, and mark it FAILED.

    Marking it FAILED must not depend on anything else working: not on its tools
    importing (a broken import path is a common reason to fail), not on Coder
    answering, not on the first try of the store. The sweep never relaunches a
    FAILED workflow, and retires a chat left behind here.
    """
    workflow_id = failed.workflow_id
    rt = runtime(failed.credentials, failed.ledger)
    workflow = await with_retries(lambda: rt.store.get_workflow(rt.tenant, workflow_id))
    if workflow is None or workflow.flow_run_id != failed.flow_run_id:
        log.info(f"A newer run owns workflow {workflow_id}; its chat is left to that run.")
        return
    fence = Fence(tenant=rt.tenant, workflow_id=workflow_id, epoch=workflow.epoch)
    if failed.settings.archive_at_end:
        tools = _tools_if_they_import(failed, log)
        try:
            await with_retries(
                lambda: retire_workflow_chat(
                    rt.client, rt.store, fence, tools, failed.settings.options(), log.info
                )
            )
        except (CoderError, TimeoutError) as exc:
            log.warning(f"Could not archive the chat of workflow {workflow_id}: {exc}")
    await with_retries(lambda: rt.store.finish(fence, WorkflowState.FAILED))
    log.info(f"Workflow {workflow_id} is marked failed; the sweep will not relaunch it.")


def _tools_if_they_import(failed: FailedWorkflow, log: LoggingAdapter) -> StepTools:
    try:
        return StepTools.build(
            import_tools(failed.tools), allow_plain=failed.settings.allow_plain_tools
        )
    except CoderError as exc:
        log.warning(
            f"The workflow's tools do not import ({exc}); its chat is archived without them "
            "(an effect still in flight keeps the chat paused for the sweep)."
        )
        return StepTools()


def _step_of(marker: str) -> int:
    digits = marker.rsplit("step-", 1)[-1].rstrip("]")
    return int(digits) if digits.isdigit() else 0
