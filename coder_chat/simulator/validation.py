"""Request validation with the exact texts of the wire reference (sections 1.4, 3.3, 9)."""

from __future__ import annotations

import re
import uuid
from typing import Any

from .errors import ApiError, bad_request
from .state import JSON, StoredFile

_LABEL_KEY = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._/-]*$")
MAX_LABELS = 50
MAX_DYNAMIC_TOOLS = 250
MAX_SYSTEM_PROMPT = 10_000


def parse_uuid(value: Any, message: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise bad_request(message) from None


def input_parts(content: Any, files: dict[uuid.UUID, StoredFile]) -> list[JSON]:
    """Validate client input parts and resolve them to stored message parts."""
    if not isinstance(content, list) or not content:
        raise bad_request("Content is required.", "Content cannot be empty.")
    parts: list[JSON] = []
    for index, raw in enumerate(content):
        parts.append(_input_part(index, raw, files))
    return parts


def _input_part(index: int, raw: Any, files: dict[uuid.UUID, StoredFile]) -> JSON:
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        text = str(raw.get("text") or "").strip()
        if not text:
            raise bad_request("Invalid input part.", f"content[{index}].text cannot be empty.")
        return {"type": "text", "text": text}
    if kind == "file":
        stored = _known_file(raw.get("file_id"), files)
        if stored is None:
            raise bad_request(
                "Invalid input part.",
                f"content[{index}].file_id references a file that does not exist.",
            )
        return {"type": "file", "file_id": str(stored.id), "media_type": stored.mime_type}
    if kind == "file-reference":
        keys = ("file_name", "start_line", "end_line", "content")
        return {"type": "file-reference", **{k: raw.get(k) for k in keys}}
    raise bad_request("Invalid input part.", f'content[{index}].type "{kind}" is not supported.')


def _known_file(value: Any, files: dict[uuid.UUID, StoredFile]) -> StoredFile | None:
    try:
        return files.get(uuid.UUID(str(value)))
    except ValueError:
        return None


def labels(value: Any) -> dict[str, str]:
    """Validate a label map as ``ValidateChatLabels`` does."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError(
            400, "Invalid labels.", validations=[{"field": "labels", "detail": "must be an object"}]
        )
    problems: list[JSON] = []
    if len(value) > MAX_LABELS:
        problems.append({"field": "labels", "detail": f"too many labels (maximum {MAX_LABELS})"})
    for key, val in value.items():
        field = f"labels.{key}"
        if not key or len(key.encode()) > 64 or not _LABEL_KEY.match(key):
            problems.append(
                {
                    "field": field,
                    "detail": "label key must be 1-64 bytes of [a-zA-Z0-9._/-], starting alphanumeric",
                }
            )
        if not isinstance(val, str) or not val or len(val.encode()) > 256:
            problems.append(
                {
                    "field": field,
                    "detail": "label value must be a non-empty string of at most 256 bytes",
                }
            )
    if problems:
        raise ApiError(400, "Invalid labels.", validations=problems)
    return {str(k): str(v) for k, v in value.items()}


def dynamic_tools(value: Any) -> list[JSON]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request("Invalid dynamic tools.")
    if len(value) > MAX_DYNAMIC_TOOLS:
        raise bad_request(
            "Too many dynamic tools.", f"Maximum {MAX_DYNAMIC_TOOLS} dynamic tools per chat."
        )
    seen: set[str] = set()
    tools: list[JSON] = []
    for raw in value:
        name = str(raw.get("name") or "") if isinstance(raw, dict) else ""
        if not name.strip():
            raise bad_request("Dynamic tool name must not be empty.")
        if name in seen:
            raise bad_request(
                "Duplicate dynamic tool name.", f'Tool "{name}" appears more than once.'
            )
        seen.add(name)
        assert isinstance(raw, dict)
        tools.append(
            {
                "name": name,
                "description": raw.get("description", ""),
                "input_schema": raw.get("input_schema") or {},
            }
        )
    return tools


def title_from_prompt(parts: list[JSON]) -> str:
    """The initial title: the first prompt's first six words, at most 80 characters."""
    text = " ".join(p["text"] for p in parts if p.get("type") == "text")
    words = text.split()
    if not words:
        return "New Chat"
    return " ".join(words[:6])[:80]


def busy_behavior(value: Any) -> str:
    if value in (None, ""):
        return "queue"
    if value not in ("queue", "interrupt"):
        raise bad_request("Invalid busy_behavior value.", 'Must be "queue" or "interrupt".')
    return str(value)


def int_param(raw: str | None, name: str) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise bad_request(f"Invalid {name} parameter.") from None
