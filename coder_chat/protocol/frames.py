"""Decoding ``/stream`` frames into typed events.

A frame is a JSON array of events (the server batches up to 256); a bare object
is tolerated. The fast path validates the whole frame at once; only when that
fails (an event type this client does not know, a bare object, a malformed
event) does it fall back to one event at a time, so an unknown event is
skipped while a malformed known one is an error.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from .models import KNOWN_EVENT_TYPES, STREAM_EVENT, STREAM_FRAME, AnyEvent, OtherEvent


class FrameError(ValueError):
    """A frame that is not valid JSON, or an event that does not match its type."""


def parse_frame(raw: str | bytes) -> list[AnyEvent]:
    try:
        return list(STREAM_FRAME.validate_json(raw))
    except ValidationError:
        return _slow_path(raw)


def _slow_path(raw: str | bytes) -> list[AnyEvent]:
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FrameError(f"stream frame is not valid JSON: {exc}") from None
    items = [data] if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise FrameError(f"stream frame is neither an array nor an object: {type(data).__name__}")
    return [_one(item) for item in items]


def _one(item: Any) -> AnyEvent:
    if not isinstance(item, dict) or not isinstance(item.get("type"), str):
        raise FrameError("stream event without a string 'type'")
    if item["type"] not in KNOWN_EVENT_TYPES:
        return OtherEvent.model_validate(item)
    try:
        return STREAM_EVENT.validate_python(item)
    except ValidationError as exc:
        raise FrameError(
            f"malformed {item['type']!r} event: {exc.error_count()} problem(s)"
        ) from None
