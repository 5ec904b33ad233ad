"""Retiring a chat whose workflow is over: drop its queue, answer its pause, stop its run,
archive it.

The workflow's own archive at its end, its failure hook and the orphan sweep all
retire chats this one way. Prompts still queued are dropped first: a dead run's next
step, which answering the pause would start. A pause is answered next, from the ledger
(:func:`.reconcile.answer_pause` in ``retire`` mode), because it may be the only
pending record of an effect that ran; when a committing effect cannot be finished
here (its tool is not available), the chat is left paused and reported, never
interrupted away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from ..client.session import ChatSession, SessionHooks
from ..errors import CoderApiError
from .bounded import within
from .context import StepContext
from .markers import step_number
from .reconcile import answer_pause, interrupt_quietly
from .records import Fence
from .settle import SETTLED
from .store import DurableStore


@dataclass
class Retired:
    """What became of the chat: ``archived``, ``already archived`` or ``left``, and why."""

    chat_id: str
    action: str
    detail: str = ""

    @property
    def done(self) -> bool:
        return self.action != "left"


async def retire_chat(ctx: StepContext, chat_id: str) -> Retired:
    chat = await ctx.client.get_chat(chat_id)
    if chat.archived:
        return Retired(chat_id, "already archived")
    if chat.status != "waiting":  # a waiting chat has run its queue
        await _withdraw_queue(ctx, chat_id)
    detail = ""
    if chat.status == "requires_action":
        answer = await answer_pause(ctx, chat_id, "retire")
        if answer.blocked:
            return Retired(chat_id, "left", answer.summary())
        detail = answer.summary()
    await _stop_run(ctx, chat_id)
    session = ChatSession(
        ctx.client,
        ctx.tenant,
        chat_id=chat_id,
        options=ctx.options.chat,
        hooks=SessionHooks(before_action=ctx.may_act),
    )
    await session.archive()  # retries its 409 while a stopped run winds down
    return Retired(chat_id, "archived", detail)


async def retire_checkpointed_chat(
    store: DurableStore,
    fence: Fence,
    context: Callable[[int], StepContext],
    report: Callable[[str], None],
) -> Retired | None:
    """Retire the chat the workflow's checkpoint points at, as the step its journal names
    (``context(step)`` makes that step's context); ``None`` when it has no chat."""
    workflow = await store.get_workflow(fence.tenant, fence.workflow_id)
    if workflow is None or workflow.chat_id is None:
        report(f"Workflow {fence.workflow_id} never created a chat; nothing to archive.")
        return None
    return await retire_as_journaled(store, fence, workflow.chat_id, context, report)


async def retire_as_journaled(
    store: DurableStore,
    fence: Fence,
    chat_id: str,
    context: Callable[[int], StepContext],
    report: Callable[[str], None],
) -> Retired:
    """Retire one chat of the workflow, as the step its journal names, and say what became
    of it."""
    record = await store.get_chat(fence.tenant, chat_id)
    step = step_number(record.journal.marker if record and record.journal else "")
    retired = await retire_chat(context(step), chat_id)
    if retired.done:
        report(f"Chat {chat_id} of workflow {fence.workflow_id} is {retired.action}.")
    else:
        report(f"Chat {chat_id} of workflow {fence.workflow_id} was left paused: {retired.detail}")
    return retired


async def _withdraw_queue(ctx: StepContext, chat_id: str) -> None:
    """Drop the prompts queued on the chat, before its pause is answered or its run stopped.

    A run that died may leave its next step's prompt queued behind a pause (campaign
    20261607/25: step 5 queued behind step 4's); answering the pause, or the run ending,
    would start it, after a person's cancel, with nothing to read its answer. Gone
    already (promoted, or withdrawn by someone else) is fine: 404 or 409.
    """
    for queued in (await ctx.client.get_messages(chat_id, limit=1)).queued_messages:
        await ctx.may_act("withdraw")
        try:
            await ctx.client.delete_queued_message(chat_id, queued.id)
        except CoderApiError as exc:
            if exc.status not in (404, 409):
                raise


async def _stop_run(ctx: StepContext, chat_id: str) -> None:
    """Interrupt until the chat settles; bounded. A settled chat costs one read."""
    opts = ctx.options
    async with within(
        opts.chat.interrupt_timeout + opts.chat.archive_window, "stopping the run", chat_id
    ):
        while (await ctx.client.get_chat(chat_id)).status not in SETTLED:
            # Live, or paused again by a run our answers revived: nothing of this
            # pause has run (no process runs its tools), so interrupting loses nothing.
            await interrupt_quietly(ctx, chat_id)
            await asyncio.sleep(opts.poll_interval)
