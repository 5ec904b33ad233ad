"""A workflow run's bookkeeping: take the fencing epoch, beat, finish, and report."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from prefect import task
from prefect.artifacts import acreate_markdown_artifact

from coder_chat import CoderError
from coder_chat.durable.markers import step_marker
from coder_chat.durable.records import Fence, WorkflowState
from coder_chat.durable.step import StepResult
from coder_chat.durable.store import FencedOut
from coder_chat.protocol.transcript import to_transcript
from prefect_coder.blocks import CoderCredentials
from prefect_coder.tasks._runtime import RETRY_DELAYS, Ledger, retry_if_transient, run_log, runtime
from prefect_coder.tasks.runs import name_and_supersede, slug


@dataclass(frozen=True)
class Began:
    """What ``begin_workflow`` hands the flow: who acts, with which epoch, replacing what."""

    tenant: str
    epoch: int
    #: The name of the flow run this one replaces, when it stopped without finishing.
    took_over_from: str | None = None
    #: The id of the flow run that held the workflow before, while it was running.
    previous_run: str | None = None


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
    credentials: CoderCredentials | None = None,
    ledger: Ledger | None = None,
    archive_at_end: bool = True,
    name_the_run: bool = True,
) -> Began:
    """Take the workflow's next epoch: from now on only this run may act for it.

    With ``name_the_run``, the flow run is named after the workflow and epoch, and the
    run it replaces (one that stopped without finishing) is marked superseded; a flow
    run holding many workflows does both itself.
    """
    log = run_log()
    rt = runtime(credentials, ledger)
    before = await rt.store.get_workflow(rt.tenant, workflow_id)
    fence = await rt.store.begin_run(
        rt.tenant,
        workflow_id,
        deployment=deployment,
        flow_run_id=flow_run_id,
        archive_at_end=archive_at_end,
    )
    previous = before.flow_run_id if before and before.state == WorkflowState.RUNNING else None
    if name_the_run:
        first = "its first run" if fence.epoch == 1 else f"run {fence.epoch}"
        log.info(f"Workflow {workflow_id}: this is {first} (epoch {fence.epoch}).")
    took_over = None
    if flow_run_id is not None and name_the_run:
        took_over = await name_and_supersede(workflow_id, fence.epoch, flow_run_id, previous, log)
    return Began(rt.tenant, fence.epoch, took_over, previous)


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
    credentials: CoderCredentials | None = None,
    ledger: Ledger | None = None,
) -> None:
    rt = runtime(credentials, ledger)
    await rt.store.finish(Fence(tenant=rt.tenant, workflow_id=workflow_id, epoch=epoch), state)


async def heartbeat_forever(
    workflow_id: str,
    epoch: int,
    interval: float,
    credentials: CoderCredentials | None = None,
    ledger: Ledger | None = None,
) -> None:
    """Beat every ``interval`` seconds until cancelled; only a superseded run stops beating.

    The sweep trusts this heartbeat, not Prefect's zombie detection, which is
    minutes late and never sees a killed worker. So a failed beat (the store
    restarting, say) is logged and tried again at the next one: stopping would make
    a healthy run look stranded and get it relaunched.
    """
    log = run_log()
    rt = runtime(credentials, ledger)
    fence = Fence(tenant=rt.tenant, workflow_id=workflow_id, epoch=epoch)
    while True:
        await asyncio.sleep(interval)
        try:
            await rt.store.heartbeat(fence)
        except FencedOut:
            log.warning(f"A newer run took workflow {workflow_id}; this run stops beating.")
            return
        except CoderError as exc:
            log.warning(f"Heartbeat of workflow {workflow_id} failed ({exc}); trying again.")


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
    credentials: CoderCredentials | None = None,
    ledger: Ledger | None = None,
) -> str | None:
    """A markdown artifact: the steps with their verdicts and attempts, then the transcript."""
    if not results:
        return None
    chat_id = results[-1].chat_id
    client = runtime(credentials, ledger).client
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
    key = f"transcript-{slug(workflow_id)}"
    artifact = await acreate_markdown_artifact(
        markdown="\n".join(lines), key=key, description=f"Durable chat {workflow_id}"
    )
    return str(artifact)


def _cell(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
