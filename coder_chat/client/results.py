"""What ``ChatSession.generate`` returns: plain pydantic models, safe to persist as JSON."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ..protocol.models import ChatMessage, Usage
from ..protocol.transcript import call_args, final_text, to_transcript


class ToolCallRecord(BaseModel):
    tool_call_id: str
    tool_name: str
    args: Any = None
    output: Any = None
    is_error: bool = False
    provider_executed: bool = False


class StepRecord(BaseModel):
    """One model step: one committed assistant message."""

    message_id: int
    text: str
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    usage: Usage | None = None


class TurnResult(BaseModel):
    """A finished turn: the final step's text, every step, and where the chat now stands."""

    text: str
    finish_reason: Literal["stop", "tool-calls", "error"]
    usage: Usage
    steps: list[StepRecord] = Field(default_factory=list)
    chat_id: str
    last_seen_message_id: int | None = None
    output: Any = None


def build_steps(messages: list[ChatMessage]) -> list[StepRecord]:
    """Steps from a turn's committed messages, each call paired with its result."""
    results = {
        p.tool_call_id: p
        for m in messages
        if m.role == "tool"
        for p in m.content
        if p.type == "tool-result"
    }
    steps = []
    for message in messages:
        if message.role != "assistant":
            continue
        calls = []
        for part in message.content:
            if part.type != "tool-call" or not part.tool_call_id:
                continue
            result = results.get(part.tool_call_id)
            calls.append(
                ToolCallRecord(
                    tool_call_id=part.tool_call_id,
                    tool_name=part.tool_name or "",
                    args=call_args(part.args),
                    output=result.result if result else None,
                    is_error=bool(result and result.is_error),
                    provider_executed=bool(part.provider_executed),
                )
            )
        steps.append(
            StepRecord(
                message_id=message.id, text=message.text(), tool_calls=calls, usage=message.usage
            )
        )
    return steps


def turn_text(messages: list[ChatMessage], client_tools: set[str]) -> str:
    return final_text(to_transcript(messages).messages, client_tools)
