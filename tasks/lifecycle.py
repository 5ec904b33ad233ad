"""``reconcile_chat`` and ``archive_chat``: a workflow chat's recovery and its end of life."""

from __future__ import annotations

import asyncio
import contextlib

from prefect import get_run_logger, task

from coder_chat import ChatSession, CoderApiError, CoderError
from coder_chat.durable.context import DurableOptions, StepContext, StepTools
from coder_chat.durable.reconcile import interrupt_quietly, reconcile_pause
from coder_chat.durable.records import Fence
from coder_chat.durable.step import StepSpec, recover

from ._runtime import connected, import_model, import_tools, retry_if_transient


@task(
    name="reconcile-chat",
    task_run_name="reconcile {workflow_id} step {step}",
    retries=2,
    retry_delay_seconds=[2, 10],
    retry_condition_fn=retry_if_transient,
)
async def reconcile_chat(
    workflow_id: str,
    step: int,
    epoch: int,
    tools: list[str] | None = None,
    allow_plain_tools: bool = False,
    output_schema: str | None = None,
    credentials_block: str | None = None,
    ledger_block: str | None = None,
    options: DurableOptions | None = None,
) -> str:
    """Settle the workflow's chat and say whether step ``step`` finished (never resubmits).

    Returns ``"recovered"`` (the attempt finished; its result is in history),
    ``"unfinished"`` (a re-run would resubmit) or ``"no-chat"``.
    """
    log = get_run_logger()
    output_type = import_model(output_schema)
    step_tools = StepTools.build(
        import_tools(tools or []), allow_plain=allow_plain_tools, output_type=output_type
    )
    async with connected(credentials_block, ledger_block, log.info) as (client, store, tenant):
        workflow = await store.get_workflow(tenant, workflow_id)
        if workflow is None or workflow.chat_id is None:
            log.info(f"workflow {workflow_id} has no chat; nothing to reconcile")
            return "no-chat"
        fence = Fence(tenant=tenant, workflow_id=workflow_id, epoch=epoch)
        ctx = StepContext(
            client,
            store,
            fence,
            workflow_id,
            step,
            step_tools,
            options or DurableOptions(),
            log.info,
        )
        recovered = await recover(
            ctx, StepSpec(prompt="", output_type=output_type), workflow.chat_id, "hard_crash"
        )
        verdict = "unfinished" if recovered is None else "recovered"
        log.info(f"reconcile: step {step} of {workflow_id} is {verdict}")
        return verdict


@task(
    name="archive-chat",
    task_run_name="archive {workflow_id}",
    retries=2,
    retry_delay_seconds=[2, 10],
    retry_condition_fn=retry_if_transient,
)
async def archive_chat(
    workflow_id: str,
    epoch: int,
    tools: list[str] | None = None,
    allow_plain_tools: bool = False,
    credentials_block: str | None = None,
    ledger_block: str | None = None,
    options: DurableOptions | None = None,
) -> bool:
    """Archive the workflow's chat, once: reconcile a paused tool first, then interrupt, then archive.

    Returns whether a chat was archived (``False`` when the workflow never made one).
    Already archived counts as done.
    """
    log = get_run_logger()
    opts = options or DurableOptions()
    step_tools = StepTools.build(import_tools(tools or []), allow_plain=allow_plain_tools)
    async with connected(credentials_block, ledger_block, log.info) as (client, store, tenant):
        workflow = await store.get_workflow(tenant, workflow_id)
        if workflow is None or workflow.chat_id is None:
            log.info(f"workflow {workflow_id} never created a chat; nothing to archive")
            return False
        chat_id = workflow.chat_id
        fence = Fence(tenant=tenant, workflow_id=workflow_id, epoch=epoch)
        record = await store.get_chat(tenant, chat_id)
        step = _step_of(record.journal.marker if record and record.journal else "")
        ctx = StepContext(client, store, fence, workflow_id, step, step_tools, opts, log.info)
        chat = await client.get_chat(chat_id)
        if chat.archived:
            log.info(f"chat {chat_id} is already archived")
            return True
        if chat.status == "requires_action":
            await reconcile_pause(ctx, chat_id, "abort")
        with contextlib.suppress(CoderError, TimeoutError):
            async with asyncio.timeout(opts.interrupt_timeout):
                await interrupt_quietly(ctx, chat_id)
        session = ChatSession(
            client=client,
            organization_id=tenant,
            chat_id=chat_id,
            archive_retry_interval=opts.archive_retry_interval,
            archive_window=opts.archive_window,
        )
        try:
            await session.archive()
        except CoderApiError as exc:
            log.warning(f"archive of chat {chat_id} failed: {exc}")
            raise
        log.info(f"archived chat {chat_id} of workflow {workflow_id}")
        return True


def _step_of(marker: str) -> int:
    digits = marker.rsplit("step-", 1)[-1].rstrip("]")
    return int(digits) if digits.isdigit() else 0
