"""A workflow run's bookkeeping: take the fencing epoch, beat, finish, and report."""

from __future__ import annotations

import asyncio
import contextlib

from prefect import get_run_logger, task
from prefect.artifacts import acreate_markdown_artifact

from coder_chat import CoderError
from coder_chat.durable.markers import step_marker
from coder_chat.durable.records import Fence, WorkflowState
from coder_chat.durable.step import StepResult
from coder_chat.durable.store import FencedOut
from coder_chat.protocol.transcript import to_transcript

from ._runtime import RETRY_DELAYS, connected, load_credentials, load_ledger, retry_if_transient


@task(
    name="begin-workflow",
    task_run_name="begin {workflow_id}",
    retries=len(RETRY_DELAYS),
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_if_transient,
)
async def begin_workflow(
    workflow_id: str,
    deployment: str,
    flow_run_id: str | None,
    credentials_block: str | None = None,
    ledger_block: str | None = None,
    archive_at_end: bool = True,
) -> tuple[str, int]:
    """Take the workflow's next epoch: from now on only this run may act for it.

    Returns the tenant (organization id) and the epoch.
    """
    _, _, tenant = (await load_credentials(credentials_block)).resolved()
    store = (await load_ledger(ledger_block)).get_store()
    try:
        fence = await store.begin_run(
            tenant,
            workflow_id,
            deployment=deployment,
            flow_run_id=flow_run_id,
            archive_at_end=archive_at_end,
        )
    finally:
        await store.close()
    get_run_logger().info(f"Workflow {workflow_id}: this run holds epoch {fence.epoch}.")
    return tenant, fence.epoch


@task(
    name="finish-workflow",
    task_run_name="finish {workflow_id} {state}",
    retries=len(RETRY_DELAYS),
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_if_transient,
)
async def finish_workflow(
    workflow_id: str,
    epoch: int,
    state: WorkflowState,
    credentials_block: str | None = None,
    ledger_block: str | None = None,
) -> None:
    _, _, tenant = (await load_credentials(credentials_block)).resolved()
    store = (await load_ledger(ledger_block)).get_store()
    try:
        await store.finish(Fence(tenant=tenant, workflow_id=workflow_id, epoch=epoch), state)
    finally:
        await store.close()


async def heartbeat_forever(
    workflow_id: str,
    epoch: int,
    interval: float,
    credentials_block: str | None = None,
    ledger_block: str | None = None,
) -> None:
    """Beat every ``interval`` seconds until cancelled; only a superseded run stops beating.

    The sweep trusts this heartbeat, not Prefect's zombie detection, which is
    minutes late and never sees a killed worker. So a failed beat (the store
    restarting, say) is logged and tried again at the next one: stopping would make
    a healthy run look stranded and get it relaunched.
    """
    log = get_run_logger()
    _, _, tenant = (await load_credentials(credentials_block)).resolved()
    store = (await load_ledger(ledger_block)).get_store()
    fence = Fence(tenant=tenant, workflow_id=workflow_id, epoch=epoch)
    try:
        while True:
            await asyncio.sleep(interval)
            try:
                await store.heartbeat(fence)
            except FencedOut:
                log.warning(f"A newer run took workflow {workflow_id}; this run stops beating.")
                return
            except CoderError as exc:
                log.warning(f"Heartbeat of workflow {workflow_id} failed ({exc}); trying again.")
    finally:
        with contextlib.suppress(CoderError):
            await asyncio.shield(store.close())


@task(
    name="publish-transcript",
    task_run_name="transcript {workflow_id}",
    retries=len(RETRY_DELAYS),
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_if_transient,
)
async def publish_transcript(
    workflow_id: str,
    results: list[StepResult],
    credentials_block: str | None = None,
    ledger_block: str | None = None,
) -> str | None:
    """A markdown artifact: the steps with their verdicts and attempts, then the transcript."""
    if not results:
        return None
    chat_id = results[-1].chat_id
    async with connected(credentials_block, ledger_block) as (client, _, _tenant):
        messages = [m async for m in client.iter_messages(chat_id)]
    attempts = [
        sum(
            1 for m in messages if m.role == "user" and step_marker(workflow_id, r.step) in m.text()
        )
        for r in results
    ]
    rows = [
        f"| {r.step} | {r.verdict} | {n} | {_cell(r.text)} |"
        for r, n in zip(results, attempts, strict=True)
    ]
    lines = [
        f"# Workflow `{workflow_id}`",
        f"Chat `{chat_id}`.",
        "",
        "| step | verdict | attempts | result |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        "## Transcript",
    ]
    for message in to_transcript(messages).messages:
        if message.role in ("user", "assistant") and message.text():
            lines.append(f"**{message.role}**: {_cell(message.text(), 2000)}")
            lines.append("")
    key = "coder-" + "".join(c if c.isalnum() else "-" for c in workflow_id.lower())[:90]
    artifact = await acreate_markdown_artifact(
        markdown="\n".join(lines), key=key, description=f"Durable chat {workflow_id}"
    )
    return str(artifact)


def _cell(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
