"""One durable step: return it from the store, recover it, or run it; record it either way.

``run_step`` is the whole algorithm of the reference's durable-workflow guide,
Prefect-free, with the store as the record of progress:

1. A step the store holds as finished is returned from there (verdict ``stored``)
   and never sent again, on any machine, whatever a result cache knows.
2. Empty checkpoint: look for a chat labelled with this workflow and this store
   (the orphan of a crashed first attempt) and adopt it, so windows 1 to 3 leave
   nothing behind.
3. A journal entry for this step (or, on a chat the step created, its marker in
   history) means an attempt may be in flight: settle the chat (:mod:`.settle`),
   then check history. A finished attempt is *recovered*, never rerun; otherwise
   the prompt is *resubmitted*.
4. Before every send on an existing chat, journal ``submitting`` with its own
   commit horizon; run the turn with the step marker in the prompt.
5. A finished step is written with its checkpoint in one transaction
   (``complete_step``). A failed turn still checkpoints its chat, and why it failed
   (a timeout, an abort) is journaled, so the next attempt, in any process, still
   pins ``cut_short``.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from ..client.session import ChatSession, SessionHooks
from ..client.tools import ClientTool, structured_output_tool
from ..errors import CoderApiError, CoderChatError, CoderError, CoderStreamError
from ..protocol.models import Chat, ChatMessage, ChatMessagePart
from ..protocol.transcript import (
    TranscriptMessage,
    answered_by_server,
    call_args,
    final_text,
    structured_output,
    to_transcript,
)
from ..protocol.usage import UsageTotals
from .budget import OverBudget
from .context import PINS_CUT_SHORT, StepContext
from .markers import (
    LABEL_WORKFLOW,
    StepHistory,
    chat_labels,
    count_attempts,
    owner_labels,
    read_tail,
)
from .reconcile import NO_RESULT, NOT_RUN
from .records import (
    JournalEntry,
    PromptChanged,
    RecoveryReason,
    StepRecord,
    StepVerdict,
    StepView,
    args_digest,
    prompt_digest,
    utcnow,
)
from .settle import Settled, settle_wait
from .stops import journal_stop, record_reason

#: How a step ended this time: its turn ran, was recovered or resubmitted; or it had
#: finished before and came from the store (``stored``) or Prefect's cache (``cached``).
Verdict = Literal["ran", "recovered", "resubmitted", "stored", "cached"]
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
    #: What the step consumed, over all its attempts (zero for one finished before
    #: usage was recorded).
    usage: UsageTotals = UsageTotals()

    @classmethod
    def from_record(cls, record: StepRecord, verdict: Verdict) -> StepResult:
        """The record's fields this result has (not its tenant or prompt), and ``verdict``."""
        kept = {name: getattr(record, name) for name in cls.model_fields if name != "verdict"}
        return cls(**kept, verdict=verdict)


@dataclass
class StepSpec:
    """What one step asks: its prompt, and the model of its structured answer, if any."""

    prompt: str
    output_type: type[BaseModel] | None = None


@dataclass
class _Recovered:
    text: str
    output: Any
    cursor: int | None


class _Answer(Protocol):
    """A step's answer, from its turn or from history."""

    @property
    def text(self) -> str: ...

    @property
    def output(self) -> Any: ...


@dataclass
class Recovery:
    """What recovery found: the earlier attempt's answer (``None``: send it again), and
    the chat's history as it read it (back to ``since``, when it was asked to)."""

    answer: _Recovered | None
    history: StepHistory


async def run_step(ctx: StepContext, spec: StepSpec) -> StepResult:
    view = await ctx.store.get_step_view(ctx.tenant, ctx.workflow_id, ctx.step)
    stored, workflow = view.step, view.workflow
    if stored is not None:
        check_same_prompt(stored, spec.prompt)
        ctx.report(
            f"{ctx.name} finished earlier ({stored.verdict}); its result comes from the "
            "store and nothing is sent again."
        )
        return StepResult.from_record(stored, "stored")
    ctx.guard.confirm_epoch(workflow.epoch if workflow else None)
    spent = workflow.spent if workflow else UsageTotals()
    check_budget(ctx, spent)
    chat_id = workflow.chat_id if workflow else None
    cursor = workflow.last_seen_message_id if workflow else None
    adopted = False
    if chat_id is None and not ctx.first_try:
        chat_id = await adopt_orphan(ctx)
        adopted, cursor = chat_id is not None, None
    verdict: StepVerdict = "ran"
    # The step's stretch of its chat starts where the step before ended on it: what
    # came after, whoever sent it, is this step's to count.
    start = (view.previous_cursor or 0) if chat_id and chat_id == view.previous_chat_id else 0
    earlier = UsageTotals()
    if chat_id is not None:
        reason = await _attempt_in_flight(ctx, view, chat_id, adopted)
        if reason is not None:
            ctx.report(
                f"{ctx.name}: an earlier attempt may still be on chat {chat_id} "
                f"({_REASONS[reason]}); checking what became of it before sending anything."
            )
            recovery = await recover(ctx, spec, chat_id, reason, since=start)
            found = recovery.answer
            if found is not None:
                used = recovery.history.usage(start, found.cursor)
                return await _complete(
                    ctx, spec, chat_id, found.cursor, found, "recovered", usage=used, spent=spent
                )
            verdict = "resubmitted"
            ctx.report(f"{ctx.name}: the earlier attempt did not finish; sending it again.")
            # The resend's stream reads on from where this read ended.
            cursor = recovery.history.last_id
            earlier = recovery.history.usage(start, cursor)
        elif (cursor or 0) != start:
            earlier = await _usage_between(ctx, chat_id, start, cursor)
    return await _run_turn(ctx, spec, chat_id, cursor, verdict, earlier, spent)


_REASONS: dict[RecoveryReason, str] = {
    "hard_crash": "the process running it stopped",
    "timeout": "it timed out",
    "abort": "it was cut off by its deadline or a cancellation",
}


def check_budget(ctx: StepContext, spent: UsageTotals) -> None:
    """Raise :class:`OverBudget` when what the workflow's finished steps consumed (as the
    store holds it) reached a limit of its budget: this step is not taken."""
    ctx.options.budget.check(ctx.workflow_id, ctx.step, spent)


def check_same_prompt(stored: StepRecord, prompt: str) -> None:
    """Refuse a prompt that differs from the one this finished step ran (workflow code
    that decided differently on the same answers)."""
    if stored.prompt_digest and stored.prompt_digest != prompt_digest(prompt):
        raise PromptChanged(stored.workflow_id, stored.step, stored.prompt or None, prompt)


async def _attempt_in_flight(
    ctx: StepContext, view: StepView, chat_id: str, adopted: bool
) -> RecoveryReason | None:
    """Why recovery must run before a send on ``chat_id``, or ``None`` when no attempt of
    this step can be there. ``view`` is what the step read first; an adopted chat was not
    checkpointed then, so its journal is read afresh."""
    if adopted:
        record = await ctx.store.get_chat(ctx.tenant, chat_id)
        entry = record.journal if record else None
    else:
        entry = view.journal
    if entry is not None and entry.marker == ctx.marker:
        return entry.reason or "hard_crash"
    if adopted:
        return "hard_crash"
    previous_step_on_it = ctx.step > 1 and view.previous_chat_id == chat_id
    if entry is None and not previous_step_on_it:
        # The step before did not finish on this chat, so this step may have made it.
        return "hard_crash" if await _created_with_this_step(ctx, chat_id) else None
    return None


async def _usage_between(
    ctx: StepContext, chat_id: str, start: int, cursor: int | None
) -> UsageTotals:
    """What the chat's messages in ``(start, cursor]`` consumed: a stretch of this step's
    that its turn's stream will not read (an earlier attempt's checkpoint moved past it)."""
    history = await read_tail(ctx.client, chat_id, ctx.marker, since=start)
    return history.usage(start, cursor)


async def _complete(
    ctx: StepContext,
    spec: StepSpec,
    chat_id: str,
    cursor: int | None,
    answer: _Answer,
    verdict: StepVerdict,
    notes: list[str] | None = None,
    *,
    usage: UsageTotals,
    spent: UsageTotals,
) -> StepResult:
    """Write the finished step and its checkpoint in one transaction, then return it
    (``usage``: what the step consumed; ``spent``: what the steps before it did)."""
    text, output = answer.text, answer.output
    record = StepRecord(
        tenant=ctx.tenant,
        workflow_id=ctx.workflow_id,
        step=ctx.step,
        chat_id=chat_id,
        last_seen_message_id=cursor,
        text=text,
        output=output.model_dump(mode="json") if isinstance(output, BaseModel) else output,
        verdict=verdict,
        prompt_digest=prompt_digest(spec.prompt),
        prompt=spec.prompt,
        notes=notes or [],
        usage=usage,
    )
    await asyncio.shield(ctx.store.complete_step(ctx.fence, record, spent + usage))
    # A fenced write: what the workflow does next (the archive at its end, say) needs no
    # store read to know this run still holds it.
    ctx.guard.confirm()
    return StepResult.from_record(record, verdict)


# -- recovery -----------------------------------------------------------------------------------


async def recover(
    ctx: StepContext,
    spec: StepSpec,
    chat_id: str,
    reason: RecoveryReason,
    *,
    since: int | None = None,
) -> Recovery:
    """Settle the chat, then recover the attempt's result (its answer ``None``: resubmit),
    with the history read back to ``since`` at least.

    Before anything acts on the chat (settling may answer a pause, and so run a tool),
    the attempt on it must be this step's with this prompt: one sent with another prompt
    is refused, untouched.
    """
    await check_sent_prompt(ctx, spec.prompt, chat_id)
    settled, tail = await _settled_history(ctx, chat_id, reason, since)
    return Recovery(_judge(ctx, spec, settled, tail, reason), tail)


def _judge(
    ctx: StepContext, spec: StepSpec, settled: Settled, tail: StepHistory, reason: RecoveryReason
) -> _Recovered | None:
    """The earlier attempt's answer as the settled chat's history holds it, or ``None``
    when it did not finish (cut short, failed, its tools' outcome never seen, no answer)."""
    cut_short = settled.cut_short or (reason in PINS_CUT_SHORT and settled.stopped_at is None)
    last_user = tail.prompt
    if last_user is None:
        ctx.report(f"{ctx.name}: its prompt never reached the chat.")
        return None
    if settled.stopped_at is not None and not cut_short:
        cut_short = not _ended_before(tail.attempt(last_user), settled.stopped_at, ctx)
    if cut_short or settled.status not in ("waiting", "completed"):
        why = "it was cut short" if cut_short else f"the chat ended in {settled.status}"
        ctx.report(f"{ctx.name}: the earlier attempt did not finish ({why}).")
        return None
    after = to_transcript(tail.attempt(last_user)).messages
    if _outcome_never_seen(ctx, after):
        ctx.report(
            f"{ctx.name}: the earlier attempt finished without seeing what its tools did "
            "(Coder answered the calls itself when its tool deadline passed, or the "
            "workflow's end answered them without running them); sending it again (a call "
            "that already ran is answered from the ledger)."
        )
        return None
    output = structured_output(after, spec.output_type) if spec.output_type else None
    if spec.output_type is not None and output is None:
        ctx.report(f"{ctx.name}: the earlier attempt filed no valid structured answer.")
        return None
    cursor = max((m.id for m in tail.messages), default=None)
    ctx.report(
        f"{ctx.name}: the earlier attempt finished; its answer is taken from the chat "
        "and nothing is sent again."
    )
    return _Recovered(final_text(after, ctx.tools.names), output, cursor)


async def _settle(ctx: StepContext, chat_id: str, reason: RecoveryReason) -> Settled:
    """Wait for the chat to settle, answering its pauses on the way."""
    settled = await settle_wait(ctx, chat_id, reason)
    rounds = 1
    while settled.status == "requires_action" and rounds < MAX_SETTLE_ROUNDS:
        settled = await settle_wait(ctx, chat_id, reason)
        rounds += 1
    return settled


async def _settled_history(
    ctx: StepContext, chat_id: str, reason: RecoveryReason, since: int | None
) -> tuple[Settled, StepHistory]:
    """The settled chat and its history, read again while they disagree (a late send
    landed in between); after a few rounds, what was read last."""
    for _ in range(MAX_SETTLE_ROUNDS - 1):
        settled = await _settle(ctx, chat_id, reason)
        tail = await read_tail(ctx.client, chat_id, ctx.marker, since)
        if await _read_whole(ctx, chat_id, settled, tail):
            return settled, tail
        ctx.report(
            f"{ctx.name}: a prompt reached the chat while it was being read; reading it "
            "again once it settles."
        )
    settled = await _settle(ctx, chat_id, reason)
    return settled, await read_tail(ctx.client, chat_id, ctx.marker, since)


async def _read_whole(ctx: StepContext, chat_id: str, settled: Settled, tail: StepHistory) -> bool:
    """Is the attempt read from history the one the settled chat had finished?

    A send that landed late may reach the chat between reading its state and reading
    its history: then the step's prompt is the last one with no answer after it yet
    (or half of one), and taking it as finished would keep an empty or partial
    answer. A prompt followed by another was answered whole; one that is last must
    end in the model's message, with the chat still settled after the read. An
    attempt cut short (or that an interrupt may have cut) is never taken as finished,
    so its history needs no such care.
    """
    prompt = tail.prompt
    # Cut, or cut unless history shows it ended before the interrupt: an empty or
    # partial attempt, or one written after the interrupt, reads as cut.
    cut = settled.cut_short or settled.stopped_at is not None
    if cut or settled.status not in ("waiting", "completed"):
        return True
    if prompt is None or tail.followed(prompt):
        return True
    attempt = tail.attempt(prompt)
    if not attempt or attempt[-1].role != "assistant":
        return False
    return (await ctx.client.get_chat(chat_id)).status in ("waiting", "completed")


def _ended_before(attempt: list[ChatMessage], stopped_at: datetime, ctx: StepContext) -> bool:
    """Had Coder written the whole attempt before an interrupt sent at ``stopped_at``
    (this machine's clock) could have reached it? Anything an interrupt cuts is written
    after it lands, so an attempt stamped earlier, beyond the allowed clock skew, was
    not cut by it."""
    limit = stopped_at - timedelta(seconds=ctx.options.clock_skew)
    stamps = [m.created_at for m in attempt]
    ended = bool(stamps) and all(s is not None and s < limit for s in stamps)
    if ended:
        ctx.report(
            f"{ctx.name}: the earlier attempt had finished before its interrupt was sent "
            "(whether that interrupt reached Coder is unknown), so it was not cut short."
        )
    return ended


async def check_sent_prompt(ctx: StepContext, prompt: str, chat_id: str) -> None:
    """Refuse, before acting, an attempt of this step that was sent with another prompt
    (a read of the chat's history; nothing is written)."""
    if not prompt:
        return  # a reconcile that only wants to know whether the step finished
    last_user = (await read_tail(ctx.client, chat_id, ctx.marker)).prompt
    if last_user is None:
        return
    if prompt not in last_user.text():
        sent = last_user.text().replace(ctx.marker, "", 1).strip()
        raise PromptChanged(ctx.workflow_id, ctx.step, sent, prompt, finished=False)


def _outcome_never_seen(ctx: StepContext, after: list[TranscriptMessage]) -> bool:
    """Did the model only ever get a stand-in answer for a client tool call of this step
    (and for every same-arguments call after it): Coder's own "timed out", or the "not
    run" / "no result" the workflow's end gave a pause as it retired the chat?

    After a crash, Coder's tool deadline may pass before recovery: the tool ran and its
    output never reached the model, or it never ran at all (the process died first).
    A cancel (or a failure's end) answers a pause without running its calls, and a
    resume carries the workflow on from there. Either way the attempt was cut short,
    not finished: the step goes again, and a repeated call is answered from the ledger
    (an effect at most once).
    """
    tools = set(ctx.tools.durable) | set(ctx.tools.plain)
    calls: dict[str, set[str]] = {}
    for message in after:
        for part in message.parts:
            if part.type == "tool-call" and part.tool_name in tools and part.tool_call_id:
                same = f"{part.tool_name}:{args_digest(call_args(part.args))}"
                calls.setdefault(same, set()).add(part.tool_call_id)
    results = [p for m in after for p in m.parts if p.type == "tool-result"]
    asked = {p.tool_call_id for p in results}
    seen = {p.tool_call_id for p in results if not _stand_in(p)}
    return any(ids & asked and not ids & seen for ids in calls.values())


def _stand_in(part: ChatMessagePart) -> bool:
    """A tool result that is not the tool's own: Coder's, or a retired pause's."""
    retired = bool(part.is_error) and part.result in (NOT_RUN, NO_RESULT)
    return answered_by_server(part) or retired


async def _created_with_this_step(ctx: StepContext, chat_id: str) -> bool:
    """A checkpointed chat with no journal entry at all: did this step's create send it?

    A send that creates the chat is never journaled (there is no chat to journal it
    on), so a checkpoint written after it (a failed turn's checkpoint, or an adoption
    by a run that then died) is all that is left of an attempt that may have finished.
    History decides: an attempt carrying this step's marker is recovered, never rerun.
    """
    return await count_attempts(ctx.client, chat_id, ctx.marker) > 0


async def labelled_chats(ctx: StepContext) -> list[Chat]:
    """The chats this workflow made in this store, newest first (a read)."""
    labels = {
        **owner_labels(ctx.options.deployment, await ctx.store.store_id()),
        LABEL_WORKFLOW: ctx.workflow_id[:256],
    }
    found: list[Chat] = [c async for c in ctx.client.iter_chats(labels=labels)]
    found.sort(key=lambda c: (c.created_at is not None, c.created_at), reverse=True)
    return found


async def adopt_orphan(ctx: StepContext) -> str | None:
    """With an empty checkpoint, adopt the newest chat this workflow made in this store."""
    found = await labelled_chats(ctx)
    if not found:
        return None
    chosen = found[0]
    await ctx.store.save_checkpoint(ctx.fence, chosen.id, None)
    older = f"; {len(found) - 1} older one(s) are left to the sweep" if len(found) > 1 else ""
    ctx.report(
        f"No checkpoint yet: adopted chat {chosen.id} ({chosen.status}), made by an "
        f"attempt whose process stopped before recording it{older}."
    )
    return chosen.id


# -- the turn -----------------------------------------------------------------------------------


async def _run_turn(
    ctx: StepContext,
    spec: StepSpec,
    chat_id: str | None,
    cursor: int | None,
    verdict: StepVerdict,
    earlier: UsageTotals,
    spent: UsageTotals,
) -> StepResult:
    """Send the step and see its turn through; ``earlier`` is what the step's stretch of
    the chat consumed up to ``cursor``, where the turn's stream starts reading, ``spent``
    what the steps before it did."""
    again = verdict == "resubmitted"
    notes = await _ledger_notes(ctx, chat_id) if chat_id and again else []
    prompt = " ".join([ctx.marker, spec.prompt, *notes]) + _schema_note(ctx, spec)
    entry = await _journal_send(ctx, chat_id, again) if chat_id is not None else None
    session = await _session(ctx, spec, chat_id, cursor, entry)
    try:
        result = await session.generate(
            prompt, deadline=ctx.options.step_deadline, output_type=spec.output_type
        )
    except BaseException as exc:
        await asyncio.shield(_after_failure(ctx, session, entry, exc))
        over = OverBudget.from_coder(ctx.workflow_id, ctx.step, exc)
        if over is not None:
            raise over from exc  # Coder refuses until its limit resets: never retried
        if isinstance(exc, CoderStreamError):
            # The durable layer can always retry a lost stream: the retry settles the
            # chat and reads history before it sends anything (the run may well finish).
            raise CoderStreamError(str(exc), chat_id=exc.chat_id, retryable=True) from exc
        raise
    used = earlier + UsageTotals.of(session.seen_usage.values())
    cursor = result.last_seen_message_id
    return await _complete(
        ctx, spec, result.chat_id, cursor, result, verdict, notes, usage=used, spent=spent
    )


async def _session(
    ctx: StepContext,
    spec: StepSpec,
    chat_id: str | None,
    cursor: int | None,
    entry: JournalEntry | None,
) -> ChatSession:
    """The step's session: the workflow's chat options as they are, with the step's labels
    (read by Coder only when this step creates the chat), and its stops journaled before
    they are sent (``entry``: the attempt's write-ahead, if its send was journaled)."""
    opts = ctx.options
    labels = chat_labels(ctx.workflow_id, ctx.step, opts.deployment, await ctx.store.store_id())
    return ChatSession(
        ctx.client,
        ctx.tenant,
        chat_id=chat_id,
        last_seen_message_id=cursor,
        options=opts.chat.labelled(labels),
        tools=_session_tools(ctx, spec),
        hooks=SessionHooks(
            ctx.may_act,
            _teller(ctx) if opts.story else None,
            functools.partial(journal_stop, ctx, entry),
        ),
    )


def _teller(ctx: StepContext) -> Callable[[str], None]:
    """The turn's story as the step's report lines (``Step 2: sent 'Fix it'.``), the step
    marker left out of the prompt: the line names the step already.

    Each line is written at the event loop's next turn, not in the call: the turn then
    waits for Coder, and the line's cost (most of a millisecond through a log handler)
    is paid while it waits, off the step's critical path. Lines keep their order.
    """
    marker, to = f"{ctx.marker} ", ctx.tell or ctx.report
    loop = asyncio.get_running_loop()

    def tell(line: str) -> None:
        loop.call_soon(to, f"{ctx.name}: {line.replace(marker, '', 1)}")

    return tell


async def _after_failure(
    ctx: StepContext, session: ChatSession, entry: JournalEntry | None, exc: BaseException
) -> None:
    """Keep what the next attempt needs: the chat (checkpointed) and why this one failed.

    A chat the failed turn created is kept too, even after a lost stream: its run may
    finish on the server, and recovery finds it there. (Starting over on a fresh chat
    would run its tool effects again under new keys.)
    """
    chat_id = session.chat_id or (exc.chat_id if isinstance(exc, CoderStreamError) else None)
    if chat_id is None:
        return
    # Cut short only if stopping it may have cut the run: not when nothing was running
    # (it had ended by itself), the interrupt never left, or the prompt was withdrawn.
    # Then recovery judges the attempt from history, as after a crash.
    cut = session.last_stop not in ("idle", "undelivered", "withdrawn")
    # An interrupt sent whose outcome never came back: when it was sent, so that
    # recovery can tell an attempt Coder had finished before it.
    stopped_at = session.last_stop_at if session.last_stop == "unknown" else None
    try:
        if cut and isinstance(exc, CoderChatError) and exc.kind == "timeout":
            await record_reason(ctx, chat_id, entry, "timeout", stopped_at)
        elif cut and isinstance(exc, TimeoutError | asyncio.CancelledError):
            await record_reason(ctx, chat_id, entry, "abort", stopped_at)
        elif not cut and session.last_stop_at is not None:
            # The stop's write-ahead stands, yet its interrupt cut nothing: clear it.
            await record_reason(ctx, chat_id, entry, None, None)
        elif isinstance(exc, CoderApiError) and entry is not None and _send_refused(exc):
            # The server refused the send: nothing is in flight, so recovery need not
            # sleep out the commit horizon before sending again.
            await ctx.store.write_journal(
                ctx.fence, chat_id, entry.model_copy(update={"horizon": None})
            )
        cursor = session.last_seen_message_id if session.chat_id else None
        await ctx.store.save_checkpoint(ctx.fence, chat_id, cursor)
    except CoderError as store_exc:
        # The turn's own failure is the one to raise; recovery copes without these.
        ctx.report(f"{ctx.name}: could not record the failed attempt ({store_exc}).")


class _AnyAnswer(BaseModel):
    """The declared shape of ``structured_output`` when steps differ: each step validates its own."""

    model_config = ConfigDict(extra="allow")


def _session_tools(ctx: StepContext, spec: StepSpec) -> list[ClientTool]:
    tools = ctx.tools.for_session(ctx.binding)
    if ctx.options.structured_output:
        tools.append(structured_output_tool(_AnyAnswer))
    return tools


def _schema_note(ctx: StepContext, spec: StepSpec) -> str:
    """The step's answer schema, in its prompt: the chat declared ``structured_output``
    for every step at once, so its declaration cannot say which shape this step wants."""
    if spec.output_type is None or not ctx.options.structured_output:
        return ""
    schema = json.dumps(spec.output_type.model_json_schema(), separators=(",", ":"))
    return (
        "\n\nAnswer by calling the structured_output tool once, with arguments matching "
        f"this JSON schema: {schema}"
    )


#: Answers that prove the server did not take the prompt (a gateway's 502/504 or a
#: 500 might come after the backend committed it, so those keep the horizon).
_REFUSED = frozenset({400, 401, 403, 404, 409, 413, 422, 425, 429, 503})


def _send_refused(exc: CoderApiError) -> bool:
    return exc.method == "POST" and exc.path.endswith("/messages") and exc.status in _REFUSED


async def _journal_send(ctx: StepContext, chat_id: str, again: bool) -> JournalEntry:
    """Write-ahead of a send on an existing chat, with its own commit horizon.

    A first send of the step needs no history read: every send on an existing chat
    is journaled, and nothing journaled this step, so its attempt count is 0.
    """
    attempts = await count_attempts(ctx.client, chat_id, ctx.marker) if again else 0
    now = utcnow()
    entry = JournalEntry(
        state="submitting",
        marker=ctx.marker,
        attempt=attempts,
        at=now,
        horizon=now + timedelta(seconds=ctx.options.horizon),
    )
    await ctx.store.write_journal(ctx.fence, chat_id, entry)
    ctx.guard.confirm()  # a fenced write: the send right after needs no other check
    return entry


async def _ledger_notes(ctx: StepContext, chat_id: str) -> list[str]:
    """Effects this step already committed: told to the model so it does not repeat them."""
    entries = [e for e in await ctx.store.list_tools(ctx.tenant, chat_id) if e.marker == ctx.marker]
    return [
        f"(Note: {e.tool_name} already ran for this step, call {e.tool_call_id}, and "
        f"returned {e.output!r}; do not repeat it.)"
        for e in entries
        if e.state == "done"
    ]
