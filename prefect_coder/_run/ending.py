"""How a workflow's chat is left at its end: archived (idle, or retired the whole way),
reopened when a person resumes it, and a workflow that failed for good marked failed."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prefect.logging.loggers import LoggingAdapter

from coder_chat import CoderApiError, CoderError
from coder_chat.durable.markers import usage_after
from coder_chat.durable.records import AfterSteps, WorkflowState
from coder_chat.durable.retire import Retired, retire_checkpointed_chat
from coder_chat.durable.step import StepResult
from coder_chat.protocol.usage import UsageTotals
from prefect_coder._run.workflow import WorkflowRun, finish_workflow


async def retire_workflow_chat(run: WorkflowRun, report: Callable[[str], None]) -> Retired | None:
    """Retire the chat the workflow's checkpoint points at; ``None`` when it has none."""
    return await retire_checkpointed_chat(
        run.runtime.store, run.fence, lambda step: run.step_context(step, report), report
    )


async def archive_idle_chat(run: WorkflowRun, chat_id: str) -> bool:
    """Archive a chat the workflow's last turn left idle: one request. ``True`` when
    that was all; ``False`` when the chat turned out not to be idle (a prompt that
    landed late is running, Coder answered 409): the caller retires it the whole way.

    The last turn saw its run end, so there is no pause to answer and nothing to stop.
    """
    await run.guard("archive")
    try:
        await run.runtime.client.archive_chat(chat_id)
    except CoderApiError as exc:
        if exc.status == 400 and "already archived" in exc.message:
            return True
        if exc.status != 409:
            raise
        return False
    return True


async def after_last_step(
    run: WorkflowRun, results: Sequence[StepResult], archived: str | None
) -> AfterSteps | None:
    """What the archived chat ran past the last step's stretch (a prompt of that step's
    that landed late, after it finished), so that the workflow's usage counts it; ``None``
    when the chat is not the last step's or was not archived (it may still run).

    A workflow's first run whose every turn it sent once and saw answered left no send in
    flight that could land late: it asks nothing (a turn is its send and its stream).
    """
    last = results[-1] if results else None
    if last is None or archived is None or archived != last.chat_id:
        return None
    if run.fence.epoch == 1 and all(r.verdict == "ran" for r in results):
        return AfterSteps(step=last.step, usage=UsageTotals())
    cursor = last.last_seen_message_id or 0
    usage = await run.retried(lambda: usage_after(run.runtime.client, archived, cursor))
    return AfterSteps(step=last.step, usage=usage)


async def reopen_chat(run: WorkflowRun, chat_id: str, report: Callable[[str], None]) -> None:
    """Unarchive the chat of a workflow that ended failed or cancelled and is carried on
    now (resumed): its next step goes on in the same conversation."""
    await run.guard("unarchive")
    chat = await run.runtime.client.get_chat(chat_id)
    if chat.archived:
        await run.runtime.client.update_chat(chat_id, archived=False)
        report(f"Chat {chat_id} was archived when workflow {run.workflow_id} ended; reopened.")


async def end_failed_workflow(
    run: WorkflowRun, log: LoggingAdapter, state: WorkflowState = WorkflowState.FAILED
) -> bool:
    """The workflow's run failed for good (or it went over budget): archive its chat if
    asked, and mark it ``state``; ``False`` when a newer run owns the workflow by then
    (nothing is done).

    Marking it must not depend on anything else working: not on Coder answering, not
    on the first try of the store. The sweep never relaunches a workflow that ended so,
    and retires a chat left behind here.
    """
    workflow_id = run.workflow_id
    if not await run.retried(run.guard.holds):
        log.info(f"A newer run owns workflow {workflow_id}; its chat is left to that run.")
        return False
    if run.workflow.settings.archive_at_end:
        try:
            await run.retried(lambda: retire_workflow_chat(run, log.info))
        except (CoderError, TimeoutError) as exc:
            log.warning(f"Could not archive the chat of workflow {workflow_id}: {exc}")
    await finish_workflow(run, state)
    said = "failed" if state == WorkflowState.FAILED else str(state).replace("-", " ")
    log.info(f"Workflow {workflow_id} is marked {said}; the sweep will not relaunch it.")
    return True
