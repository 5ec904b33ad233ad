"""Reconciling a ``requires_action`` pause against the tool ledger.

The pause may be the only pending record of an effect that ran just before a
crash. So it is never interrupted away while the ledger shows a committed
effect:

=============  ==========================================  ================================
entry          meaning                                     action
=============  ==========================================  ================================
``done``       effect committed, result stranded           submit the recorded output
``committing`` crashed between write-ahead and ``done``    re-drive with the same key
none           the tool never ran                          interrupting loses nothing
=============  ==========================================  ================================

One verdict for the whole batch (``resumed``, or ``cut-short`` when any call
never started) is journaled before anything is re-driven or sent, so a crash
anywhere in between leaves a verdict the next pass can act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..client.tools import ToolArgumentsError, tool_output
from ..errors import CoderApiError
from ..protocol.models import ToolCallRequest
from ..protocol.transcript import STRUCTURED_OUTPUT, pending_client_calls
from .context import StepContext
from .markers import count_attempts
from .records import JournalEntry, LedgerEntry, RecoveryReason, args_digest, utcnow

PAGE = 200


@dataclass
class _Plan:
    call: ToolCallRequest
    entry: LedgerEntry | None
    action: str  # "submit", "redrive", "run", "answer", "unstarted"


async def reconcile_pause(ctx: StepContext, chat_id: str, reason: RecoveryReason) -> bool:
    """Answer or cut short the pause; return ``True`` when it fell back to interrupting."""
    page = await ctx.client.get_messages(chat_id, limit=PAGE)
    pending = pending_client_calls(page.messages, ctx.tools.names)
    plans = [await _plan(ctx, chat_id, call) for call in pending]
    unstarted = not pending or any(p.action == "unstarted" for p in plans)
    attempts = await count_attempts(ctx.client, chat_id, ctx.marker)
    verdict = "cut-short" if unstarted else "resumed"
    await ctx.store.write_journal(
        ctx.fence,
        chat_id,
        JournalEntry(
            state=verdict, marker=ctx.marker, attempt=attempts, at=utcnow(), reason=reason
        ),
    )
    results = [r for p in plans if (r := await _answer(ctx, chat_id, p)) is not None]
    ctx.report(
        f"reconciled pause on chat {chat_id}: {len(results)} answered from the ledger, "
        f"verdict {verdict}" + ("" if pending else " (no pending call of this step's tools)")
    )
    if results:
        await ctx.client.submit_tool_results(chat_id, results)
    if unstarted:
        await interrupt_quietly(ctx, chat_id)
    return unstarted


async def _plan(ctx: StepContext, chat_id: str, call: ToolCallRequest) -> _Plan:
    if call.tool_name == STRUCTURED_OUTPUT or call.tool_name in ctx.tools.plain:
        return _Plan(call, None, "run")
    entry = await ctx.store.get_tool(ctx.tenant, chat_id, call.tool_call_id)
    if entry is not None:
        return _Plan(call, entry, "submit" if entry.state == "done" else "redrive")
    tool = ctx.tools.durable[call.tool_name]
    try:
        digest = args_digest(tool.tool.validate(call.args).model_dump(mode="json"))
    except ToolArgumentsError:
        return _Plan(call, None, "unstarted")
    prior = await tool.same_step_call(ctx.binding, chat_id, digest, exclude=call.tool_call_id)
    return _Plan(call, prior, "answer") if prior is not None else _Plan(call, None, "unstarted")


async def _answer(ctx: StepContext, chat_id: str, plan: _Plan) -> dict[str, Any] | None:
    """The result to submit for one planned call (re-driving where needed)."""
    call, entry = plan.call, plan.entry
    if plan.action == "unstarted":
        return None
    if plan.action == "run":
        output, is_error = await _run_effect_free_or_plain(ctx, chat_id, call)
        return {"tool_call_id": call.tool_call_id, "output": output, "is_error": is_error}
    assert entry is not None
    if plan.action == "submit":
        return {
            "tool_call_id": call.tool_call_id,
            "output": entry.output,
            "is_error": entry.is_error,
        }
    tool = ctx.tools.durable[call.tool_name]
    args = tool.tool.validate(call.args)
    if plan.action == "redrive":
        output = await tool.redrive(ctx.binding, entry, args)
    else:  # "answer": a same-step call under an earlier id; record this id too
        output = (
            entry.output if entry.state == "done" else await tool.redrive(ctx.binding, entry, args)
        )
        await ctx.store.claim_tool(
            ctx.fence,
            chat_id,
            call.tool_call_id,
            tool_name=call.tool_name,
            marker=ctx.marker,
            args_digest=entry.args_digest,
        )
        await ctx.store.complete_tool(ctx.fence, chat_id, call.tool_call_id, output=output)
    return {"tool_call_id": call.tool_call_id, "output": output, "is_error": False}


async def _run_effect_free_or_plain(
    ctx: StepContext, chat_id: str, call: ToolCallRequest
) -> tuple[Any, bool]:
    tool = (
        ctx.tools.structured
        if call.tool_name == STRUCTURED_OUTPUT
        else ctx.tools.plain[call.tool_name]
    )
    assert tool is not None
    try:
        args = tool.validate(call.args)
    except ToolArgumentsError as exc:
        return str(exc), True
    if tool.function is None:
        return {"ok": True}, False
    # A plain tool has no ledger: the caller allowed it to run again after a crash.
    ctx.report(f"re-running plain tool {tool.name} for call {call.tool_call_id} (no ledger)")
    key = f"{ctx.tenant}/{chat_id}/{call.tool_call_id}"
    return tool_output(await tool.call_function(args, key)), False


async def interrupt_quietly(ctx: StepContext, chat_id: str) -> int:
    """Interrupt; answer the HTTP status (409: nothing was running)."""
    try:
        await ctx.client.interrupt_chat(chat_id)
    except CoderApiError as exc:
        if exc.status != 409:
            raise
        return 409
    return 200
