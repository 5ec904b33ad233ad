"""Stops are journaled before they are sent.

An interrupt cuts whatever the chat's run was writing, and nothing in Coder's history
says so: a cut answer reads like a short one. So the only record that an attempt may
have been cut is the journal, and it is written first: the attempt's entry gets the
reason ``abort`` and the moment of the stop (``stopped_at``), then the interrupt goes.
Once its outcome is known the entry is pinned (the run was cut: ``stopped_at`` cleared)
or put back as it was (409: nothing was running). Should the answer never come, the
entry keeps ``stopped_at``, and recovery takes as finished only an attempt Coder had
written whole before it.

A stop whose write-ahead fails is not sent: the run goes on, and whoever stops it
later (the step's recovery, the workflow's end, a cancel's sweep) journals first too.
This closes fleet lab finding 16 (24/3): a cancel's interrupt landed while the store
was out of reach, the journal never learnt of it, and the resume kept the cut answer.

Only a context that holds the workflow's own fence journals: a run, its recovery, its
end, :func:`.sweep.end_cancelled`, and the sweep stopping a stuck turn (fenced at the
epoch the store holds for the workflow, so a run that took it since refuses the stop).
The sweep retiring chats whose workflows are over journals nothing.
"""

from __future__ import annotations

from datetime import datetime

from .context import PINS_CUT_SHORT, StepContext
from .records import JournalEntry, RecoveryReason, utcnow


async def record_reason(
    ctx: StepContext,
    chat_id: str,
    entry: JournalEntry | None,
    reason: RecoveryReason | None,
    stopped_at: datetime | None,
) -> None:
    """Journal why the attempt ``entry`` names failed, so a later recovery pins it cut
    (unless ``stopped_at`` is set and Coder had finished the attempt before then);
    ``None`` records no reason: recovery judges the attempt from history."""
    base = entry or JournalEntry(state="submitting", marker=ctx.marker, attempt=0, at=utcnow())
    update = {"reason": reason, "stopped_at": stopped_at}
    await ctx.store.write_journal(ctx.fence, chat_id, base.model_copy(update=update))


async def journal_stop(
    ctx: StepContext, entry: JournalEntry | None, chat_id: str, at: datetime
) -> None:
    """The write-ahead of a stop sent at ``at``: the attempt ``entry`` names (this step's
    first, when its send made the chat and journaled nothing) may be cut from then on."""
    await record_reason(ctx, chat_id, entry, "abort", at)


class JournaledStop:
    """One interrupt of recovery or of a workflow's end, journaled around: :meth:`ahead`
    before it is sent, then :meth:`cut` (200) or :meth:`cut_nothing` (409)."""

    def __init__(self, ctx: StepContext, chat_id: str) -> None:
        self.ctx = ctx
        self.chat_id = chat_id
        self._before: JournalEntry | None = None
        self._written = False

    async def ahead(self) -> None:
        ctx = self.ctx
        if ctx.fence.workflow_id != ctx.workflow_id or ctx.step < 1:
            return  # the orphan sweep's, or a chat no step of which is known
        record = await ctx.store.get_chat(ctx.tenant, self.chat_id)
        before = record.journal if record else None
        if before is not None and before.marker != ctx.marker:
            return  # another step's attempt: not this context's to judge
        if before is not None and before.reason in PINS_CUT_SHORT and before.stopped_at is None:
            return  # pinned cut already: nothing this stop does can change it
        await journal_stop(ctx, before, self.chat_id, utcnow())
        self._before, self._written = before, True

    async def cut(self) -> None:
        """The interrupt was taken: the attempt was cut, whatever history shows."""
        if self._written:
            await record_reason(self.ctx, self.chat_id, self._before, "abort", None)

    async def cut_nothing(self) -> None:
        """Nothing was running (409): the entry as it was before the stop."""
        if self._written:
            before = self._before
            reason = before.reason if before else None
            stopped_at = before.stopped_at if before else None
            await record_reason(self.ctx, self.chat_id, before, reason, stopped_at)
