"""Committed history as a transcript, and what a turn's answer was (pure helpers).

History does not say which tool calls were client tools, so the helpers that cut
at a client-tool boundary take the set of client tool names the step declares.
:func:`pending_calls` is the one derivation of what a pause waits on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .models import ChatMessage, ChatMessagePart, ToolCallRequest

STRUCTURED_OUTPUT = "structured_output"
#: What Coder itself answers for a client call nobody answered: its tool deadline
#: passed, or an interrupt (or a new message) cut the pause.
SERVER_TOOL_ANSWERS = frozenset(
    {
        "Tool execution timed out",
        "Tool execution interrupted by user",
        "Tool execution interrupted by user message",
    }
)


def answered_by_server(part: ChatMessagePart) -> bool:
    """A tool result Coder wrote in the client's place: the model never saw the tool's own."""
    return part.type == "tool-result" and bool(part.is_error) and part.result in SERVER_TOOL_ANSWERS


M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class TranscriptMessage:
    id: int
    role: str
    parts: tuple[ChatMessagePart, ...]

    def text(self) -> str:
        return "".join(p.text or "" for p in self.parts if p.type == "text")


@dataclass
class Transcript:
    """Messages in chronological order (by id)."""

    messages: list[TranscriptMessage] = field(default_factory=list)

    def last_user(self) -> TranscriptMessage | None:
        return next((m for m in reversed(self.messages) if m.role == "user"), None)

    def after(self, message: TranscriptMessage) -> list[TranscriptMessage]:
        return [m for m in self.messages if m.id > message.id]


def to_transcript(messages: Iterable[ChatMessage]) -> Transcript:
    """Order committed messages (any page order) into a transcript, one entry per id."""
    by_id = {m.id: m for m in messages}
    ordered = [by_id[i] for i in sorted(by_id)]
    return Transcript([TranscriptMessage(m.id, m.role, tuple(m.content)) for m in ordered])


def final_text(messages: Sequence[TranscriptMessage], client_tools: Iterable[str]) -> str:
    """The final step's text: assistant text after the last call to a client tool."""
    tools = set(client_tools)
    parts = [p for m in messages if m.role == "assistant" for p in m.parts]
    cut = 0
    for index, part in enumerate(parts):
        if part.type == "tool-call" and part.tool_name in tools and not part.provider_executed:
            cut = index + 1
    return "".join(p.text or "" for p in parts[cut:] if p.type == "text")


def structured_output(messages: Sequence[TranscriptMessage], model: type[M]) -> M | None:
    """The last ``structured_output`` call whose input validates against ``model``."""
    calls = [
        p
        for m in messages
        if m.role == "assistant"
        for p in m.parts
        if p.type == "tool-call" and p.tool_name == STRUCTURED_OUTPUT
    ]
    for call in reversed(calls):
        try:
            return model.model_validate(call_args(call.args))
        except ValidationError:
            continue
    return None


def call_args(raw: Any) -> Any:
    """Tool-call arguments as a value, whether the wire sent an object or JSON text."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return raw
    return {} if raw is None else raw


@dataclass
class Pending:
    """The calls a ``requires_action`` pause waits on, and the prompt they answer."""

    calls: list[ChatMessagePart] = field(default_factory=list)
    #: The user message the paused turn answers (whose step marker says whose calls these are).
    prompt: TranscriptMessage | None = None

    def requests(self) -> list[ToolCallRequest]:
        """The calls as ``action_required`` lists them (arguments as JSON text)."""
        return [
            ToolCallRequest(
                tool_call_id=p.tool_call_id or "",
                tool_name=p.tool_name or "",
                args=p.args if isinstance(p.args, str) else json.dumps(call_args(p.args)),
            )
            for p in self.calls
        ]


def pending_calls(messages: Iterable[ChatMessage], exclude: Iterable[str] = ()) -> Pending:
    """What a pause waits on: the last assistant message's tool calls nobody answered.

    The one derivation of pending calls, for the live turn and for every reconcile. At a
    ``requires_action`` pause Coder has run its own tools of that step, so every call
    left unanswered is one it waits on, and it wants them all answered in one request (a
    partial set is refused): none is left out for its name. Which may *run* is the
    caller's decision, by name (a call to a tool it does not have is answered "not
    available", never run). Provider-executed calls and the ids in ``exclude`` (already
    answered by this turn) are not pending.
    """
    transcript = to_transcript(messages).messages
    last = next((m for m in reversed(transcript) if m.role == "assistant"), None)
    if last is None:
        return Pending()
    skip = set(exclude)
    skip.update(
        p.tool_call_id or ""
        for m in transcript
        if m.id > last.id
        for p in m.parts
        if p.type == "tool-result"
    )
    calls = [
        p
        for p in last.parts
        if p.type == "tool-call" and not p.provider_executed and p.tool_call_id not in skip
    ]
    prompt = next((m for m in reversed(transcript) if m.role == "user" and m.id < last.id), None)
    return Pending(calls, prompt)
