"""The settle-wait: stop what a crash left behind and wait until the chat settles.

Settled is necessary, not sufficient: the crashed attempt may have finished the
step's work, which the result check (:mod:`.step`) decides from history. What
this module decides is ``cut_short``: whether the last attempt was truncated, so
that its finish must not be taken for a completed attempt.

* a ``requires_action`` pause is reconciled against the ledger, never interrupted away;
* a journaled ``resumed``/``cut-short`` verdict for this very attempt is honoured
  (a ``cut-short`` intent is re-driven: the journal records intent, not a landed interrupt);
* anything else is interrupted; a 409 means nothing was running, unless the probe
  saw ``interrupting`` (an earlier interrupt already truncated the attempt);
* a matching ``submitting`` entry means a send may still be in flight: sleep out
  its commit horizon, then recount; an unlanded send over an existing attempt pins
  ``cut_short``;
* then poll to ``waiting``/``completed``/``error`` on a turn-scale budget, leaving
  on a stable ``requires_action`` (the revived run called a new tool).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime

from .context import StepContext
from .markers import count_attempts
from .reconcile import interrupt_quietly, reconcile_pause
from .records import RecoveryReason, utcnow

SETTLED = frozenset({"waiting", "completed", "error"})


@dataclass
class Settled:
    status: str
    cut_short: bool


async def settle_wait(ctx: StepContext, chat_id: str, reason: RecoveryReason) -> Settled:
    client, opts = ctx.client, ctx.options
    cut_short = True
    async with asyncio.timeout(opts.interrupt_timeout):
        status = (await client.get_chat(chat_id)).status
        record = await ctx.store.get_chat(ctx.tenant, chat_id)
        entry = record.journal if record else None
        attempts = await count_attempts(client, chat_id, ctx.marker)
    journaled = (
        entry if entry and entry.marker == ctx.marker and entry.attempt == attempts else None
    )
    if status == "requires_action":
        cut_short = await reconcile_pause(ctx, chat_id, reason)
        ctx.report(f"settle: reconciled a paused attempt (cut short: {cut_short})")
    elif journaled is not None and journaled.state != "submitting":
        cut_short = journaled.state == "cut-short"
        if cut_short:
            async with asyncio.timeout(opts.interrupt_timeout):
                await interrupt_quietly(ctx, chat_id)
        ctx.report(f"settle: honoured the journaled verdict {journaled.state!r}")
    else:
        async with asyncio.timeout(opts.interrupt_timeout):
            answer = await interrupt_quietly(ctx, chat_id)
        if answer == 409:
            cut_short = status == "interrupting"
        ctx.report(
            f"settle: interrupt answered {answer} (status was {status}; cut short: {cut_short})"
        )
    if journaled is not None and journaled.state == "submitting":
        cut_short = (
            await _sleep_out_horizon(ctx, chat_id, journaled.horizon, journaled.attempt)
            or cut_short
        )
    return Settled(await _poll(ctx, chat_id, cut_short), cut_short)


async def _sleep_out_horizon(
    ctx: StepContext, chat_id: str, horizon: datetime | None, attempt: int
) -> bool:
    """A send journaled but not seen may still land: wait it out, then recount."""
    if horizon is not None:
        remaining = (horizon - utcnow()).total_seconds()
        if remaining > 0:
            ctx.report(f"settle: waiting {remaining:.1f}s for a journaled send's commit horizon")
            await asyncio.sleep(remaining)
    landed = await count_attempts(ctx.client, chat_id, ctx.marker)
    return landed == attempt and attempt > 0


async def _poll(ctx: StepContext, chat_id: str, cut_short: bool) -> str:
    opts = ctx.options
    async with asyncio.timeout(opts.settle_timeout):
        while True:
            status = (await ctx.client.get_chat(chat_id)).status
            if status in SETTLED or (status == "requires_action" and not cut_short):
                return status
            await asyncio.sleep(opts.poll_interval)
