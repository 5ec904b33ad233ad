"""The scripted model: a deterministic stand-in for the LLM behind a chat.

By default a turn answers ``You said: "<plain text>"``, streamed as deltas, so
every turn can be told apart. Directives (:mod:`.directives`) script tool
calls, pacing and failures. The model drives the engine exactly as a worker
would: stream deltas, commit each step, pause on client tools, then settle.
"""

from __future__ import annotations

import asyncio
import json
import secrets

from .directives import DirectiveError, Script, ToolCall, parse
from .engine import TIMED_OUT, Engine, Run, ToolOutcome
from .records import Effect
from .spending import limit_error
from .state import JSON, PendingCall
from .usage import step_usage

STRUCTURED_OUTPUT = "structured_output"
#: With no pacing, the model yields to the event loop once per this many deltas,
#: so sockets get batched frames (as a busy real server sends) and interrupts land.
UNPACED_BURST = 32


class Interrupted(Exception):
    """The run saw an interrupt and must wind down."""


async def drive(engine: Engine, run: Run, continuation: list[ToolOutcome] | None) -> None:
    """Run one turn to its end, whatever ends it."""
    try:
        await _picked_up(engine, run)
        if continuation is not None:
            await _answer(engine, run, Script(), continuation, [])
        else:
            await _turn(engine, run)
    except Interrupted:
        await _wind_down(engine, run)


async def _picked_up(engine: Engine, run: Run) -> None:
    """Era B: work waits in ``pending`` until a worker picks it up, then runs."""
    if run.chat.status == "pending":
        await asyncio.sleep(0.01)
        engine.mark_running(run.chat)


async def _turn(engine: Engine, run: Run) -> None:
    if _stopped_by_limit(engine, run):
        return
    try:
        script = parse(engine.scripted(run.prompt))
        _check_declared(run, script)
    except DirectiveError as exc:
        engine.fail_turn(
            run.chat, {"message": f"Simulator: {exc}", "kind": "config", "retryable": False}
        )
        return
    await _pause(run, script.sleep)
    ran_server: list[ToolCall] = []
    for call in script.server_tools:
        await _server_tool(engine, run, call)
        ran_server.append(call)
    if script.sleep_after_tools:
        await _pause(run, script.sleep_after_tools)
    outcomes: list[ToolOutcome] = []
    if script.client_tools:
        outcomes += await _client_tools(engine, run, script.client_tools)
    if script.has_structured:
        outcomes += await _client_tools(
            engine, run, [ToolCall(STRUCTURED_OUTPUT, script.structured)]
        )
    if script.fail:
        engine.fail_turn(run.chat, _failure(script.fail))
        return
    await _answer(engine, run, script, outcomes, ran_server)


def _stopped_by_limit(engine: Engine, run: Run) -> bool:
    """Before a model step: past the user's usage limit, the turn ends in ``usage_limit``."""
    figures = engine.over_limit()
    if figures is not None:
        engine.fail_turn(run.chat, limit_error(figures))
    return figures is not None


def _check_declared(run: Run, script: Script) -> None:
    # A model can only call client tools the chat declared; say so rather than pause forever.
    declared = {t["name"] for t in run.chat.dynamic_tools}
    for call in script.client_tools:
        if call.name not in declared:
            raise DirectiveError(f"/tool {call.name}: the chat declares no such client tool")
    if script.has_structured and STRUCTURED_OUTPUT not in declared:
        raise DirectiveError("/json: the chat declares no structured_output tool")


async def _answer(
    engine: Engine, run: Run, script: Script, outcomes: list[ToolOutcome], ran: list[ToolCall]
) -> None:
    if _stopped_by_limit(engine, run):
        return
    text = _compose(script, outcomes, ran)
    count = script.deltas or engine.config.default_deltas
    await _stream_text(engine, run, text, count)
    _commit_step(engine, run, [{"type": "text", "text": _padded(text, count)}])
    engine.publish(run.chat)
    await _pause(run, 0)
    engine.finish_turn(run.chat)


def _compose(script: Script, outcomes: list[ToolOutcome], ran: list[ToolCall]) -> str:
    lines = [f"{c.name} ran on the server." for c in ran]
    for o in outcomes:
        verb = "failed" if o.is_error else "returned"
        lines.append(f"{o.call.tool_name} {verb} {json.dumps(o.output)}.")
    lines.append(f'You said: "{script.text}"')
    return " ".join(lines)


def _padded(text: str, count: int) -> str:
    # Each delta carries at least one character, so a long /deltas pads with dots.
    return text + "." * max(0, count - len(text))


async def _stream_text(engine: Engine, run: Run, text: str, count: int) -> None:
    text = _padded(text, count)
    await _pause(run, engine.config.step_delay)
    attempt = 1
    while True:
        retry = engine.faults.take_retry(run.chat.id)
        chunks = _chunks(text, count)
        for index, chunk in enumerate(chunks):
            if retry and index == max(1, len(chunks) // 2):
                break
            engine.delta(run.chat, {"role": "assistant", "part": {"type": "text", "text": chunk}})
            interval = engine.config.delta_interval
            if interval > 0 or index % UNPACED_BURST == UNPACED_BURST - 1:
                await _pause(run, interval)
        else:
            return
        engine.retry_generation(run.chat, attempt)
        attempt += 1


def _chunks(text: str, count: int) -> list[str]:
    count = max(1, min(count, len(text))) if text else 1
    size, extra = divmod(len(text), count)
    out, pos = [], 0
    for index in range(count):
        step = size + (1 if index < extra else 0)
        out.append(text[pos : pos + step])
        pos += step
    return out


async def _server_tool(engine: Engine, run: Run, call: ToolCall) -> None:
    chat = run.chat
    narration = f"Calling {call.name}."
    await _stream_text(engine, run, narration, 1)
    call_id = _call_id("srv")
    call_part = {
        "type": "tool-call",
        "tool_call_id": call_id,
        "tool_name": call.name,
        "args": call.args,
    }
    _commit_step(engine, run, [{"type": "text", "text": narration}, call_part])
    engine.publish(chat)
    engine.records.effects.append(Effect(chat.id, call_id, call.name, call.args))
    result = {"ok": True, "tool": call.name, "effect": len(engine.records.effects)}
    await _pause(run, engine.config.step_delay)
    engine.append(
        chat,
        "tool",
        [
            {
                "type": "tool-result",
                "tool_call_id": call_id,
                "tool_name": call.name,
                "result": result,
                "is_error": False,
            },
        ],
    )
    engine.publish(chat)


async def _client_tools(engine: Engine, run: Run, calls: list[ToolCall]) -> list[ToolOutcome]:
    """Call client tools, wait for their results; re-call once what timed out."""
    outcomes = await _one_client_step(engine, run, calls)
    if not engine.config.recall_timed_out_tools:
        return outcomes
    again = [
        ToolCall(o.call.tool_name, o.call.args)
        for o in outcomes
        if o.synthetic and o.output == TIMED_OUT
    ]
    if again:
        outcomes += await _one_client_step(engine, run, again)
    return outcomes


async def _one_client_step(engine: Engine, run: Run, calls: list[ToolCall]) -> list[ToolOutcome]:
    chat = run.chat
    pending = [PendingCall(_call_id("call"), c.name, c.args) for c in calls]
    await _pause(run, engine.config.step_delay)
    _commit_step(
        engine,
        run,
        [
            {
                "type": "tool-call",
                "tool_call_id": p.tool_call_id,
                "tool_name": p.tool_name,
                "args": p.args,
            }
            for p in pending
        ],
    )
    engine.publish(chat)
    answer = engine.enter_requires_action(run, pending)
    try:
        outcomes = await asyncio.wait_for(
            asyncio.shield(answer), engine.config.tool_result_deadline
        )
    except TimeoutError:
        engine.time_out_pending(chat)
        outcomes = await answer
    await _picked_up(engine, run)
    return outcomes


async def _pause(run: Run, seconds: float) -> None:
    """Sleep, or stop at once when the run is interrupted."""
    if run.interrupted.is_set():
        raise Interrupted
    if seconds <= 0:
        await asyncio.sleep(0)
    else:
        try:
            await asyncio.wait_for(run.interrupted.wait(), seconds)
        except TimeoutError:
            return
    if run.interrupted.is_set():
        raise Interrupted


async def _wind_down(engine: Engine, run: Run) -> None:
    """Commit what was generated so far after the wind-down time, then settle."""
    await asyncio.sleep(engine.config.interrupt_winddown)
    chat = run.chat
    partial = "".join(d["part"].get("text", "") for d in chat.deltas)
    if partial:
        _commit_step(engine, run, [{"type": "text", "text": partial}])
    engine.finish_turn(chat)


def _failure(mode: str) -> JSON:
    if mode == "retryable":
        return {
            "message": "The model provider is overloaded.",
            "detail": "simulated /fail retryable",
            "kind": "overloaded",
            "provider": "simulator",
            "retryable": True,
            "status_code": 529,
        }
    return {
        "message": "The model configuration is invalid.",
        "detail": "simulated /fail fatal",
        "kind": "config",
        "provider": "simulator",
        "retryable": False,
        "status_code": 400,
    }


def _commit_step(engine: Engine, run: Run, content: list[JSON]) -> None:
    """Commit one model step's assistant message, with the usage Coder reports for it."""
    usage = step_usage(run.chat, content, engine.config.cost_micros_per_token)
    engine.append(run.chat, "assistant", content, usage=usage)


def _call_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"
