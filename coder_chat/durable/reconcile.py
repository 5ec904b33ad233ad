"""The one reconciler: every ``requires_action`` pause is answered here, from the tool ledger.

Step recovery, ``archive_chat``, the failure hook and the orphan sweep all call
:func:`answer_pause`. Coder requires every pending call of a pause in one request
(a partial set is refused with ``400 Missing result``), so the answers are worked
out for all of them first and submitted together, or not at all.

A pause may be the only pending record of an effect that ran just before a crash,
so it is never interrupted away while the ledger shows a committed effect. Each
pending call is answered by what the ledger knows:

=====================  =============================================  ==========================
pending call           ``resume`` (the step goes on)                  ``retire`` (the chat ends)
=====================  =============================================  ==========================
ledger ``done``        the recorded output                            the recorded output
ledger ``committing``  re-driven under its own key                    re-driven, if the tool is
                                                                      here; else nothing is sent
no entry, durable      run now through the ledger, as the live        "not run"
                       loop would have run it
structured_output      acknowledged (the arguments are the answer)    acknowledged
plain tool             run again (no ledger: allowed explicitly)      "no result recorded"
unknown tool           "not available", as the live loop answers      "no result recorded"
=====================  =============================================  ==========================

A pause that belongs to another prompt than the step being recovered (a send
that landed late, after its step was sent again) starts nothing new either: a
call its own step already made with the same arguments gets that call's recorded
outcome, anything else "not run".

In ``resume`` mode the batch's verdict is journaled before anything is run or
sent, so a crash anywhere in between leaves a verdict the next pass acts on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..client.tools import ToolArgumentsError, ToolCallContext, ToolFailed, tool_output
from ..errors import CoderApiError, CoderConfigError
from ..protocol.models import ChatMessagePart
from ..protocol.transcript import STRUCTURED_OUTPUT, call_args, pending_calls
from .context import StepContext
from .markers import count_attempts, marker_in
from .records import JournalEntry, JournalState, RecoveryReason, args_digest, utcnow
from .stops import JournaledStop
from .tools import LedgerBinding

PAGE = 200
Mode = Literal["resume", "retire"]

NOT_RUN = "Not run: the workflow stopped before this call started, and its chat is being archived."
NOT_RUN_LATE = (
    "Not run: this prompt reached the chat a second time, late; the step's own turn "
    "already handled it."
)
NO_RESULT = (
    "No result recorded: the workflow stopped before this call's result was kept, "
    "and its chat is being archived."
)


@dataclass
class PauseAnswer:
    """What a reconcile pass did with a pause."""

    results: list[dict[str, Any]] = field(default_factory=list)
    #: Answered from a ``done`` entry, without running anything.
    recorded: int = 0
    #: Effects run now: ``committing`` ones re-driven, unstarted ones (``resume``) run.
    ran: int = 0
    #: Calls answered "not run" or "no result recorded" (``retire``).
    unanswered: int = 0
    #: Structured answers taken as they were (``structured_output``: nothing to run).
    accepted: int = 0
    #: Calls answered with an error without running: a tool not available here, or
    #: arguments it refuses.
    refused: int = 0
    #: ``committing`` calls whose tool is not here: nothing was submitted.
    blocked: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.blocked:
            return (
                f"left paused: call(s) {', '.join(self.blocked)} have an effect in flight that "
                "only their tool can finish (give the tool to whoever reconciles this chat)"
            )
        counts = [
            (self.recorded, "from the ledger"),
            (self.ran, "run now"),
            (self.unanswered, "answered as not run"),
            (self.accepted, "structured answer(s) taken"),
            (self.refused, "refused (tool not available here, or bad arguments)"),
        ]
        parts = [f"{n} {what}" for n, what in counts if n]
        return f"answered {len(self.results)} pending call(s): " + (", ".join(parts) or "none")


async def answer_pause(
    ctx: StepContext,
    chat_id: str,
    mode: Mode,
    *,
    reason: RecoveryReason = "hard_crash",
    verdict: JournalState = "resumed",
) -> PauseAnswer:
    """Answer every pending call of the pause on ``chat_id`` in one request.

    ``resume``: journal ``verdict`` for this step's attempt first, then answer (running
    what never ran). ``retire``: answer without running anything new; when a committing
    effect cannot be re-driven here, submit nothing (the chat stays paused).
    """
    pause = await read_pause(ctx, chat_id)
    calls = pause.calls
    if mode == "resume" and calls:
        attempts = await count_attempts(ctx.client, chat_id, ctx.marker)
        entry = JournalEntry(
            state=verdict, marker=ctx.marker, attempt=attempts, at=utcnow(), reason=reason
        )
        await ctx.store.write_journal(ctx.fence, chat_id, entry)
    answer = PauseAnswer()
    for call in calls:
        if mode == "retire":
            await _retire_answer(ctx, chat_id, call, answer)
        elif pause.marker in (None, ctx.marker):
            await _resume_answer(ctx, chat_id, call, answer)
        else:
            await _late_answer(ctx, chat_id, call, answer, pause.marker)
    if answer.results and not answer.blocked:
        await _submit(ctx, chat_id, answer.results)
    return answer


@dataclass
class Pause:
    """The calls a pause waits on, and the step marker of the prompt they answer."""

    calls: list[ChatMessagePart]
    marker: str | None


async def read_pause(ctx: StepContext, chat_id: str) -> Pause:
    """The pause on ``chat_id``, read from history (:func:`pending_calls`).

    Which prompt the calls answer matters: a step's prompt that landed late, after the
    step was sent again, runs a second turn whose calls are not this attempt's to act on.
    """
    page = await ctx.client.get_messages(chat_id, limit=PAGE)
    pending = pending_calls(page.messages)
    prompt = pending.prompt
    return Pause(pending.calls, marker_in(prompt.text()) if prompt else None)


async def _resume_answer(
    ctx: StepContext, chat_id: str, call: ChatMessagePart, answer: PauseAnswer
) -> None:
    """Answer as the live loop would have: the same ledger, the same keys."""
    call_id, name = call.tool_call_id or "", call.tool_name or ""
    durable = ctx.tools.durable.get(name)
    entry = await ctx.store.get_tool(ctx.tenant, chat_id, call_id)
    if entry is not None and entry.state == "done":
        answer.recorded += 1
        _add(answer, call_id, entry.output, entry.is_error)
        return
    if entry is not None and durable is None:
        raise CoderConfigError(
            f"call {call_id} of tool {name} has an effect in flight (ledger: committing) "
            "and this step does not have the tool to finish it; add it to the step's tools"
        )
    if durable is not None:
        tool = durable.bind(ctx.binding)
    elif name == STRUCTURED_OUTPUT and ctx.tools.structured is None:
        answer.accepted += 1
        _add(answer, call_id, {"ok": True}, False)  # another step's schema: nothing to check
        return
    elif name == STRUCTURED_OUTPUT:
        assert ctx.tools.structured is not None
        tool = ctx.tools.structured
    elif name in ctx.tools.plain:
        tool = ctx.tools.plain[name]
        ctx.report(
            f"Running plain tool {name} again for call {call_id} (plain tools keep no ledger)."
        )
    else:
        answer.refused += 1
        _add(answer, call_id, f"Tool {name!r} is not available in this session.", True)
        return
    try:
        args = tool.validate(call_args(call.args))
    except ToolArgumentsError as exc:
        answer.refused += 1
        _add(answer, call_id, str(exc), True)
        return
    if tool.function is None:  # structured_output: the arguments are the answer
        answer.accepted += 1
        _add(answer, call_id, {"ok": True}, False)
        return
    answer.ran += 1
    try:
        output = await tool.invoke(args, ToolCallContext(ctx.tenant, chat_id, call_id))
    except ToolFailed as exc:  # its definitive failure is its answer (the ledger has it)
        _add(answer, call_id, str(exc), True)
        return
    _add(answer, call_id, tool_output(output), False)


async def _late_answer(
    ctx: StepContext, chat_id: str, call: ChatMessagePart, answer: PauseAnswer, marker: str
) -> None:
    """A pause of another attempt (a prompt that landed late): start nothing new.

    A call its own step already made (same tool, same arguments) is answered with
    that call's recorded outcome; anything else is answered "not run".
    """
    call_id, name = call.tool_call_id or "", call.tool_name or ""
    durable = ctx.tools.durable.get(name)
    entry = await ctx.store.get_tool(ctx.tenant, chat_id, call_id)
    binding = LedgerBinding(ctx.store, ctx.fence, marker)
    if entry is not None or durable is None:
        await _retire_answer(ctx, chat_id, call, answer, binding, late=True)
        return
    try:
        args = durable.tool.validate(call_args(call.args))
    except ToolArgumentsError as exc:
        answer.refused += 1
        _add(answer, call_id, str(exc), True)
        return
    digest = args_digest(args.model_dump(mode="json"))
    prior = await durable.same_step_call(binding, chat_id, digest, exclude=call_id)
    if prior is None:
        answer.unanswered += 1
        _add(answer, call_id, NOT_RUN_LATE, True)
        return
    output = prior.output if prior.state == "done" else await durable.redrive(binding, prior, args)
    await ctx.store.claim_tool(
        ctx.fence, chat_id, call_id, tool_name=name, marker=marker, args_digest=digest
    )
    await ctx.store.complete_tool(ctx.fence, chat_id, call_id, output=output)
    answer.recorded += 1
    _add(answer, call_id, output, False)


async def _retire_answer(
    ctx: StepContext,
    chat_id: str,
    call: ChatMessagePart,
    answer: PauseAnswer,
    binding: LedgerBinding | None = None,
    *,
    late: bool = False,
) -> None:
    """Answer without starting anything new (the chat is about to be archived, or the
    pause is not this attempt's)."""
    call_id, name = call.tool_call_id or "", call.tool_name or ""
    entry = await ctx.store.get_tool(ctx.tenant, chat_id, call_id)
    durable = ctx.tools.durable.get(name)
    if entry is not None and entry.state == "done":
        answer.recorded += 1
        _add(answer, call_id, entry.output, entry.is_error)
    elif entry is not None and durable is None:
        answer.blocked.append(call_id)
    elif entry is not None:
        assert durable is not None
        try:
            args = durable.tool.validate(call_args(call.args))
        except ToolArgumentsError:
            answer.blocked.append(call_id)  # never expected: it validated when it was claimed
            return
        answer.ran += 1
        _add(answer, call_id, await durable.redrive(binding or ctx.binding, entry, args), False)
    elif name == STRUCTURED_OUTPUT:
        answer.accepted += 1
        _add(answer, call_id, {"ok": True}, False)
    else:
        answer.unanswered += 1
        unanswered = NOT_RUN if durable is not None else NO_RESULT
        _add(answer, call_id, NOT_RUN_LATE if late else unanswered, True)


def _add(answer: PauseAnswer, call_id: str, output: Any, is_error: bool) -> None:
    answer.results.append({"tool_call_id": call_id, "output": output, "is_error": is_error})


async def _submit(ctx: StepContext, chat_id: str, results: list[dict[str, Any]]) -> None:
    await ctx.may_act("tool-results")
    try:
        await ctx.client.submit_tool_results(chat_id, results)
    except CoderApiError as exc:
        # 409: the pause is over already; 400: it is another pause by now (the server's
        # tool deadline answered these calls and the model called again). Either way the
        # settle poll sees what the run does next, and a new pause is answered afresh.
        if exc.status not in (400, 409):
            raise
        ctx.report(f"The pause on chat {chat_id} changed before the answers arrived ({exc}).")


async def interrupt_quietly(ctx: StepContext, chat_id: str) -> int:
    """Interrupt, the stop journaled first (:mod:`.stops`); answer the HTTP status (409:
    nothing was running)."""
    await ctx.may_act("interrupt")
    stop = JournaledStop(ctx, chat_id)
    await stop.ahead()
    try:
        await ctx.client.interrupt_chat(chat_id)
    except CoderApiError as exc:
        if exc.status != 409:
            raise
        await stop.cut_nothing()
        return 409
    await stop.cut()
    return 200
