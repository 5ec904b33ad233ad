"""Decoding ``/stream`` frames into typed events.

A frame is a JSON array of events (the server batches up to 256); a bare object
is tolerated. Frames are parsed with orjson; deltas (nearly all of a stream's
traffic) are built by a small hand-written decoder that checks every field's
type, and the rarer events are validated by pydantic. An event type this client
does not know becomes :class:`OtherEvent` and is ignored; a malformed event of a
known type is a :class:`FrameError`.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from .models import (
    KNOWN_EVENT_TYPES,
    STREAM_EVENT,
    AnyEvent,
    DeltaPart,
    MessagePartEvent,
    OtherEvent,
)


class FrameError(ValueError):
    """A frame that is not valid JSON, or an event that does not match its type."""


def parse_frame(raw: str | bytes) -> list[AnyEvent]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise FrameError(f"stream frame is not valid JSON: {exc}") from None
    if isinstance(data, dict):
        data = [data]
    elif not isinstance(data, list):
        raise FrameError(f"stream frame is neither an array nor an object: {type(data).__name__}")
    return [_event(item) for item in data]


def _event(item: Any) -> AnyEvent:
    if type(item) is not dict:
        raise FrameError("stream event is not an object")
    kind = item.get("type")
    if kind == "message_part":
        return _delta(item)
    if type(kind) is not str:
        raise FrameError("stream event without a string 'type'")
    if kind not in KNOWN_EVENT_TYPES:
        # Ignored, never an error, whatever else it carries (a newer server's shape).
        chat_id = item.get("chat_id")
        return OtherEvent(type=kind, chat_id=chat_id if type(chat_id) is str else None)
    try:
        return STREAM_EVENT.validate_python(item)
    except ValidationError as exc:
        raise FrameError(f"malformed {kind!r} event: {exc.error_count()} problem(s)") from None


def _delta(item: dict[str, Any]) -> MessagePartEvent:
    body = item.get("message_part")
    part = body.get("part") if type(body) is dict else None
    if type(part) is not dict or type(part.get("type")) is not str:
        raise FrameError("malformed 'message_part' event: no part with a type")
    assert type(body) is dict  # implied by the part check above
    text = part.get("text")
    detail = None if len(part) == 2 and type(text) is str else _full_part(part)
    version, attempt, seq = (
        body.get("history_version"),
        body.get("generation_attempt"),
        body.get("seq"),
    )
    for value in (version, attempt, seq):
        if value is not None and type(value) is not int:
            raise FrameError("malformed 'message_part' event: coordinates must be integers")
    chat_id, role = item.get("chat_id"), body.get("role")
    return MessagePartEvent(
        chat_id if type(chat_id) is str else None,
        role if type(role) is str else "assistant",
        part["type"],
        detail.text if detail else text,
        version,
        attempt,
        seq,
        detail,
    )


def _full_part(part: dict[str, Any]) -> DeltaPart:
    """Any other part (reasoning, tool-call, tool-result deltas): every field's type checked."""
    get = part.get
    text, call_id, tool = get("text"), get("tool_call_id"), get("tool_name")
    args_delta, result_delta = get("args_delta"), get("result_delta")
    for value in (text, call_id, tool, args_delta, result_delta):
        if value is not None and type(value) is not str:
            raise FrameError("malformed 'message_part' event: a text field is not a string")
    reset = get("result_reset")
    return DeltaPart(
        part["type"],
        text,
        call_id,
        tool,
        args_delta,
        result_delta,
        reset if type(reset) is bool else None,
    )
