"""One durable step: recover what a crash left, or run the turn; checkpoint either way.

``run_step`` is the whole algorithm of the reference's durable-workflow guide,
Prefect-free:

1. Empty checkpoint: look for a chat labelled with this workflow (the orphan of
   a crashed first attempt) and adopt it, so windows 1 to 3 leave nothing behind.
   A chat recorded as discarded is never adopted.
2. A journal entry for this step means an attempt may be in flight: settle the
   chat (:mod:`.settle`), then check history. A finished attempt is *recovered*,
   never rerun; otherwise the prompt is *resubmitted*.
3. Before every send on an existing chat, journal ``submitting`` with its own
   commit horizon; run the turn with the step marker in the prompt.
4. In ``finally``, write the checkpoint (also when the turn failed), except
   after a discarded chat. Why a failed turn failed (a timeout, an abort) is
   journaled, so the next attempt, in any process, still pins ``cut_short``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..client.session import ChatSession
from ..client.tools import ClientTool, structured_output_tool
from ..errors import CoderApiError, CoderChatError, CoderError, CoderStreamError
from ..protocol.models import Chat
from ..protocol.transcript import final_text, structured_output, to_transcript
from .context import PINS_CUT_SHORT, StepContext
from .markers import LABEL_DEPLOYMENT, LABEL_WORKFLOW, chat_labels, count_attempts, read_tail
from .reconcile import interrupt_quietly
from .records import JournalEntry, RecoveryReason, utcnow
from .settle import settle_wait

Verdict = Literal["ran", "recovered", "resubmitted"]
MAX_SETTLE_ROUNDS = 8


class StepResult(BaseModel):
    """A finished step, as returned to the flow and persisted by Prefect (ids and text only)."""

    workflow_id: str
    step: int
    text: str
    output: Any = None
    chat_id: str
    last_seen_message_id: int | None = None
    verdict: Verdict
    notes: list[str] = []


@dataclass
class StepSpec:
    prompt: str
    output_type: type[BaseModel] | None = None
    system_prompt: str | None = None
    model: str | None = None
    workspace_id: str | None = None
    mcp_server_ids: list[str] = field(default_factory=list)
    deployment: str = "local"
    #: Client tools are declared once, when the chat is created: set this when any
    #: step of the workflow asks for structured output, so the first declares it.
    declare_structured_output: bool = False


@dataclass
class _Recovered:
    text: str
    output: Any
    cursor: int | None


async def run_step(ctx: StepContext, spec: StepSpec) -> StepResult:
    workflow = await ctx.store.get_workflow(ctx.tenant, ctx.workflow_id)
    chat_id = workflow.chat_id if workflow else None
    cursor = workflow.last_seen_message_id if workflow else None
    adopted = False
    if chat_id is None:
        chat_id = await adopt_orphan(ctx, spec)
        adopted, cursor = chat_id is not None, None
    verdict: Verdict = "ran"
    if chat_id is not None:
        record = await ctx.store.get_chat(ctx.tenant, chat_id)
        entry = record.journal if record else None
        if (
            adopted
            or (entry is not None and entry.marker == ctx.marker)
            or (entry is None and await _created_with_this_step(ctx, chat_id))
        ):
            reason: RecoveryReason = (
                entry.reason if entry and entry.marker == ctx.marker else None
            ) or "hard_crash"
            ctx.report(
                f"step {ctx.step}: an attempt may be in flight on chat {chat_id}; recovering ({reason})"
            )
            recovered = await recover(ctx, spec, chat_id, reason)
            if recovered is not None:
                await ctx.store.save_checkpoint(ctx.fence, chat_id, recovered.cursor)
                ctx.report(
                    f"step {ctx.step}: recovered the finished attempt's result; nothing resubmitted"
                )
                return StepResult(
                    workflow_id=ctx.workflow_id,
                    step=ctx.step,
                    text=recovered.text,
                    output=recovered.output,
                    chat_id=chat_id,
                    last_seen_message_id=recovered.cursor,
                    verdict="recovered",
                )
            verdict = "resubmitted"
            ctx.report(f"step {ctx.step}: the attempt did not finish; resubmitting")
            cursor = None
    return await _run_turn(ctx, spec, chat_id, cursor, verdict)


# -- recovery -----------------------------------------------------------------------------------


async def recover(
    ctx: StepContext, spec: StepSpec, chat_id: str, reason: RecoveryReason
) -> _Recovered | None:
    """Settle the chat, then recover the attempt's result, or ``None`` to resubmit."""
    settled = await settle_wait(ctx, chat_id, reason)
    rounds = 1
    while settled.status == "requires_action" and rounds < MAX_SETTLE_ROUNDS:
        ctx.report("settle: the revived run paused on a new client tool; reconciling again")
        settled = await settle_wait(ctx, chat_id, reason)
        rounds += 1
    cut_short = settled.cut_short or reason in PINS_CUT_SHORT
    tail = await read_tail(ctx.client, chat_id)
    last_user = tail.last_user
    submitted = last_user is not None and ctx.marker in last_user.text()
    ctx.report(
        f"result check: status {settled.status}, submitted {submitted}, cut short {cut_short}"
    )
    if not submitted or cut_short or settled.status not in ("waiting", "completed"):
        return None
    assert last_user is not None
    after = to_transcript(tail.after(last_user)).messages
    output = structured_output(after, spec.output_type) if spec.output_type else None
    if spec.output_type is not None and output is None:
        ctx.report("result check: the finished attempt filed no valid structured output")
        return None
    cursor = max((m.id for m in tail.messages), default=None)
    return _Recovered(final_text(after, ctx.tools.names), output, cursor)


async def _created_with_this_step(ctx: StepContext, chat_id: str) -> bool:
    """A checkpointed chat with no journal entry at all: did this step's create send it?

    A send that creates the chat is never journaled (there is no chat to journal it
    on), so a checkpoint written after it (the turn's ``finally``, or an adoption by a
    run that then died) is all that is left of an attempt that may have finished.
    History decides: an attempt carrying this step's marker is recovered, never rerun.
    """
    return await count_attempts(ctx.client, chat_id, ctx.marker) > 0


async def adopt_orphan(ctx: StepContext, spec: StepSpec) -> str | None:
    """With an empty checkpoint, adopt the newest chat this workflow created, if any."""
    labels = {LABEL_WORKFLOW: ctx.workflow_id, LABEL_DEPLOYMENT: spec.deployment or "local"}
    found: list[Chat] = [c async for c in ctx.client.iter_chats(labels=labels)]
    candidates = []
    for chat in found:
        record = await ctx.store.get_chat(ctx.tenant, chat.id)
        if record is None or not record.discarded:
            candidates.append(chat)
    if not candidates:
        return None
    candidates.sort(key=lambda c: (c.created_at is not None, c.created_at), reverse=True)
    chosen = candidates[0]
    await ctx.store.save_checkpoint(ctx.fence, chosen.id, None)
    ctx.report(
        f"empty checkpoint: adopted chat {chosen.id} ({chosen.status}), left by a crashed attempt"
        + (
            f"; {len(candidates) - 1} older orphan(s) left to the sweep"
            if len(candidates) > 1
            else ""
        )
    )
    return chosen.id


# -- the turn -----------------------------------------------------------------------------------


async def _run_turn(
    ctx: StepContext, spec: StepSpec, chat_id: str | None, cursor: int | None, verdict: Verdict
) -> StepResult:
    opts = ctx.options
    session = ChatSession(
        client=ctx.client,
        organization_id=ctx.tenant,
        chat_id=chat_id,
        last_seen_message_id=cursor,
        tools=_session_tools(ctx, spec),
        labels=chat_labels(ctx.workflow_id, ctx.step, spec.deployment),
        system_prompt=spec.system_prompt,
        request_timeout=opts.request_timeout,
        workspace_id=spec.workspace_id,
        mcp_server_ids=spec.mcp_server_ids,
        model=spec.model,
        redial_initial=opts.redial_initial,
        action_grace=opts.action_grace,
        archive_retry_interval=opts.archive_retry_interval,
        archive_window=opts.archive_window,
        interrupt_timeout=opts.interrupt_timeout,
    )
    notes = await _ledger_notes(ctx, chat_id) if chat_id else []
    prompt = " ".join([ctx.marker, spec.prompt, *notes])
    entry: JournalEntry | None = None
    if chat_id is not None:
        entry = await _journal_send(ctx, chat_id)
    try:
        result = await session.generate(
            prompt, deadline=opts.step_deadline, output_type=spec.output_type
        )
    except CoderStreamError as exc:
        await _discard(ctx, session, exc)
        raise
    except CoderChatError as exc:
        if exc.kind == "timeout":
            await _journal_reason(ctx, session.chat_id, entry, "timeout")
        raise
    except CoderApiError as exc:
        if entry is not None and session.chat_id is not None and _send_refused(exc):
            # The server answered the send with a refusal: nothing is in flight, so
            # recovery need not sleep out the commit horizon before resubmitting.
            with contextlib.suppress(CoderError):
                await ctx.store.write_journal(
                    ctx.fence, session.chat_id, entry.model_copy(update={"horizon": None})
                )
        raise
    except (TimeoutError, asyncio.CancelledError):
        await asyncio.shield(_journal_reason(ctx, session.chat_id, entry, "abort"))
        raise
    finally:
        if session.chat_id is not None:
            await asyncio.shield(
                ctx.store.save_checkpoint(ctx.fence, session.chat_id, session.last_seen_message_id)
            )
    return StepResult(
        workflow_id=ctx.workflow_id,
        step=ctx.step,
        text=result.text,
        output=result.output.model_dump(mode="json")
        if isinstance(result.output, BaseModel)
        else result.output,
        chat_id=result.chat_id,
        last_seen_message_id=result.last_seen_message_id,
        verdict=verdict,
        notes=notes,
    )


class _AnyAnswer(BaseModel):
    """The declared shape of ``structured_output`` when steps differ: each step validates its own."""

    model_config = ConfigDict(extra="allow")


def _session_tools(ctx: StepContext, spec: StepSpec) -> list[ClientTool]:
    tools = ctx.tools.for_session(ctx.binding)
    if spec.declare_structured_output and spec.output_type is None:
        tools.append(structured_output_tool(_AnyAnswer))
    return tools


#: Answers that prove the server did not take the prompt (a gateway's 502/504 or a
#: 500 might come after the backend committed it, so those keep the horizon).
_REFUSED = frozenset({400, 401, 403, 404, 409, 413, 422, 425, 429, 503})


def _send_refused(exc: CoderApiError) -> bool:
    return exc.method == "POST" and exc.path.endswith("/messages") and exc.status in _REFUSED


async def _journal_send(ctx: StepContext, chat_id: str) -> JournalEntry:
    """Write-ahead of a send on an existing chat, with its own commit horizon."""
    attempts = await count_attempts(ctx.client, chat_id, ctx.marker)
    now = utcnow()
    entry = JournalEntry(
        state="submitting",
        marker=ctx.marker,
        attempt=attempts,
        at=now,
        horizon=now + timedelta(seconds=ctx.options.horizon),
    )
    await ctx.store.write_journal(ctx.fence, chat_id, entry)
    return entry


async def _journal_reason(
    ctx: StepContext, chat_id: str | None, entry: JournalEntry | None, reason: RecoveryReason
) -> None:
    """Record why the attempt failed, so a later recovery pins ``cut_short``."""
    if chat_id is None:
        return
    base = entry or JournalEntry(state="submitting", marker=ctx.marker, attempt=0, at=utcnow())
    with contextlib.suppress(CoderError):
        await ctx.store.write_journal(
            ctx.fence, chat_id, base.model_copy(update={"reason": reason})
        )


async def _discard(ctx: StepContext, session: ChatSession, exc: CoderStreamError) -> None:
    """A stream failure dropped the chat this turn created: record it, retire it if safe."""
    chat_id = exc.chat_id
    if chat_id is None or session.chat_id is not None:
        return  # a resumed chat is kept; the checkpoint still points at it
    await ctx.store.mark_discarded(ctx.fence, chat_id)
    if await ctx.store.list_tools(ctx.tenant, chat_id):
        ctx.report(
            f"discarded chat {chat_id} after a stream failure; its tool effects are left to the sweep"
        )
        return
    ctx.report(f"discarded chat {chat_id} after a stream failure; retiring it")
    with contextlib.suppress(CoderError, TimeoutError):
        async with asyncio.timeout(ctx.options.interrupt_timeout):
            await interrupt_quietly(ctx, chat_id)
        await session.archive()


async def _ledger_notes(ctx: StepContext, chat_id: str) -> list[str]:
    """Effects this step already committed: told to the model so it does not repeat them."""
    entries = [e for e in await ctx.store.list_tools(ctx.tenant, chat_id) if e.marker == ctx.marker]
    notes = []
    for e in entries:
        if e.state == "done":
            notes.append(
                f"(Note: {e.tool_name} already ran for this step, call {e.tool_call_id}, and returned {e.output!r}; do not repeat it.)"
            )
    return notes
