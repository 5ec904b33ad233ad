"""The settle-wait: let a chat come to rest after a crash, and say whether the attempt was cut.

Settled is necessary, not sufficient: the crashed attempt may have finished the
step's work, which the result check (:mod:`.step`) decides from history. What
this module decides is ``cut_short``: whether the last attempt was truncated, so
that its ending must not be taken for a finished attempt.

* A ``requires_action`` pause is answered from the ledger (:mod:`.reconcile`), never
  interrupted away; the attempt carries on with every pending call answered.
* A journaled ``resumed``/``cut-short`` verdict for this very attempt is honoured (a
  ``cut-short`` intent is re-driven: the journal records intent, not a landed interrupt).
* After a timeout or an abort, an interrupt was fired already: interrupt (again) and
  count the attempt as cut short; unless the outcome of that first interrupt is unknown
  (sent, no answer): then the attempt is cut unless Coder stamped all of it before the
  interrupt was sent (:func:`.step._ended_before`).
* After a hard crash, a live run *is* the crashed attempt doing the step's work: it
  is left to finish, and only interrupted if it is still going after
  ``settle_timeout``. Interrupting it would throw that work away and make the step
  run again. A probed ``interrupting`` means someone cut the attempt already.
* A matching ``submitting`` entry means a send may still be in flight: sleep out its
  commit horizon, then recount; an unlanded send over an existing attempt pins
  ``cut_short`` (that attempt is why the send was made).
* Then poll to ``waiting``/``completed``/``error``, leaving on a stable
  ``requires_action`` when nothing was cut (the run called a new tool: reconcile again).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime

from ..errors import CoderChatError, CoderConfigError
from .bounded import within
from .context import PINS_CUT_SHORT, StepContext
from .markers import count_attempts
from .reconcile import answer_pause, interrupt_quietly
from .records import JournalEntry, JournalState, RecoveryReason, utcnow

SETTLED = frozenset({"waiting", "completed", "error"})


@dataclass
class Settled:
    status: str
    cut_short: bool
    #: Set when the attempt ended in a timeout or abort whose interrupt's outcome is
    #: unknown: when it was sent. The attempt is cut unless history shows it had ended.
    stopped_at: datetime | None = None


async def settle_wait(ctx: StepContext, chat_id: str, reason: RecoveryReason) -> Settled:
    async with within(ctx.options.chat.interrupt_timeout, "reading the chat's state", chat_id):
        status = (await ctx.client.get_chat(chat_id)).status
        entry, attempts = await _journal(ctx, chat_id)
    # The entry classifies the attempt it names, and only while it is the last one.
    journaled = entry if entry is not None and entry.attempt == attempts else None
    pinned = reason in PINS_CUT_SHORT
    stopped_at: datetime | None = None
    if status == "requires_action":
        cut_short = await _answer_pause(ctx, chat_id, reason, pinned)
    elif journaled is not None and journaled.state != "submitting":
        cut_short = journaled.state == "cut-short"
        if cut_short:
            await _interrupt(ctx, chat_id)
        ctx.report(
            f"{ctx.name}: the journal says the earlier attempt was {journaled.state}; following it."
        )
    elif pinned:
        await _interrupt(ctx, chat_id)
        # A stop written after its send landed names the attempt just before the count.
        if entry is not None and attempts in (entry.attempt, entry.attempt + 1):
            stopped_at = entry.stopped_at
        cut_short = stopped_at is None  # else history decides (step.recover)
        ctx.report(
            f"{ctx.name}: the earlier attempt ended in {_plain(reason)}; "
            "stopped what was left of it on the chat."
        )
    else:
        cut_short = status == "interrupting"
        if status not in SETTLED:
            ctx.report(
                f"{ctx.name}: the crashed attempt is still {status} on chat {chat_id}; "
                "waiting for it to finish rather than sending again."
            )
    if journaled is not None and journaled.state == "submitting":
        landed = await _sleep_out_horizon(ctx, chat_id, journaled)
        cut_short = cut_short or (not landed and journaled.attempt > 0)
    settled = await _poll(ctx, chat_id, cut_short)
    settled.stopped_at = stopped_at
    return settled


async def _journal(ctx: StepContext, chat_id: str) -> tuple[JournalEntry | None, int]:
    """This step's journal entry on the chat, if any, and how many attempts it has."""
    record = await ctx.store.get_chat(ctx.tenant, chat_id)
    entry = record.journal if record else None
    if entry is None or entry.marker != ctx.marker:
        return None, 0
    return entry, await count_attempts(ctx.client, chat_id, ctx.marker)


async def _answer_pause(
    ctx: StepContext, chat_id: str, reason: RecoveryReason, pinned: bool
) -> bool:
    """The crash hit a client-tool pause: answer it; ``True`` when the attempt is cut."""
    verdict: JournalState = "cut-short" if pinned else "resumed"
    answer = await answer_pause(ctx, chat_id, "resume", reason=reason, verdict=verdict)
    if answer.blocked:
        raise CoderConfigError(f"chat {chat_id} is {answer.summary()}")
    if not answer.results:
        # Paused, yet no call is left unanswered in history: nothing can have run.
        await _interrupt(ctx, chat_id)
        ctx.report(f"{ctx.name}: the chat was paused with no call left to answer; stopped it.")
        return True
    ctx.report(f"{ctx.name}: the chat was waiting on client tools; {answer.summary()}.")
    if pinned:
        await _interrupt(ctx, chat_id)
    return pinned


async def _interrupt(ctx: StepContext, chat_id: str) -> int:
    async with within(ctx.options.chat.interrupt_timeout, "interrupting", chat_id):
        return await interrupt_quietly(ctx, chat_id)


async def _sleep_out_horizon(ctx: StepContext, chat_id: str, entry: JournalEntry) -> bool:
    """A send journaled but not seen may still land: wait it out; ``True`` if it landed.

    History is looked at every ``poll_interval`` meanwhile, so a send that lands early
    ends the wait at once rather than at its horizon.
    """
    horizon: datetime | None = entry.horizon
    remaining = (horizon - utcnow()).total_seconds() if horizon is not None else 0.0
    if remaining > 0:
        ctx.report(
            f"{ctx.name}: the earlier prompt may still be on its way; waiting up to "
            f"{remaining:.1f} s before deciding it never arrived."
        )
    while True:
        if await count_attempts(ctx.client, chat_id, ctx.marker) > entry.attempt:
            return True
        remaining = (horizon - utcnow()).total_seconds() if horizon is not None else 0.0
        if remaining <= 0:
            return False
        await asyncio.sleep(min(ctx.options.poll_interval, remaining))


async def _poll(ctx: StepContext, chat_id: str, cut_short: bool) -> Settled:
    """Wait for the chat to settle; a run still live after ``settle_timeout`` is cut."""
    opts = ctx.options
    try:
        async with asyncio.timeout(opts.settle_timeout) as clock:
            return Settled(await _until_settled(ctx, chat_id, cut_short), cut_short)
    except TimeoutError:
        if not clock.expired():
            raise
    ctx.report(
        f"{ctx.name}: the crashed attempt was still going after "
        f"{opts.settle_timeout:.0f} s; stopping it."
    )
    await _interrupt(ctx, chat_id)
    try:
        async with asyncio.timeout(opts.chat.interrupt_timeout) as clock:
            return Settled(await _until_settled(ctx, chat_id, True), True)
    except TimeoutError:
        if not clock.expired():
            raise
    raise CoderChatError(
        f"chat {chat_id} did not settle within {opts.chat.interrupt_timeout:.0f}s of an interrupt",
        kind="timeout",
        retryable=True,
        chat_id=chat_id,
    )


async def _until_settled(ctx: StepContext, chat_id: str, cut_short: bool) -> str:
    while True:
        status = (await ctx.client.get_chat(chat_id)).status
        if status in SETTLED or (status == "requires_action" and not cut_short):
            return status
        if status == "requires_action":
            # A cut attempt paused again: no process runs its tools, nothing ran; stop it.
            await interrupt_quietly(ctx, chat_id)
        await asyncio.sleep(ctx.options.poll_interval)


def _plain(reason: RecoveryReason) -> str:
    """A recovery reason as words for a log line, with its article (``hard_crash`` →
    ``a hard crash``, ``abort`` → ``an abort``)."""
    words = reason.replace("_", " ")
    return f"an {words}" if words[:1] in "aeiou" else f"a {words}"
