"""Query parsing and paging for ``GET /chats`` and ``GET /chats/{chat}/messages``."""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Iterable, Mapping

from starlette.datastructures import QueryParams

from .errors import bad_request
from .state import JSON, Chat
from .validation import int_param

_SEARCH_KEYS = frozenset(
    {
        "archived",
        "has_unread",
        "title",
        "pr_status",
        "source",
        "diff_url",
        "pr",
        "repo",
        "pr_title",
        "search",
    }
)


def list_chats(chats: Iterable[Chat], query: QueryParams) -> list[Chat]:
    """Filter (labels ANDed, archived hidden unless asked) and page, newest first."""
    terms = _search_terms(query.get("q", ""))
    archived = terms.get("archived", "false") == "true"
    labels = _label_filters(query.getlist("label"))
    title = terms.get("title", terms.get("search", "")).lower()
    found = [
        c
        for c in chats
        if c.archived == archived
        and all(c.labels.get(k) == v for k, v in labels)
        and title in c.title.lower()
    ]
    found.sort(key=lambda c: (c.created_at, c.id.int), reverse=True)
    return _page(found, query)


def _search_terms(q: str) -> dict[str, str]:
    try:
        words = shlex.split(q)
    except ValueError:
        raise bad_request("Invalid chat search query.") from None
    terms: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition(":")
        if not sep or key not in _SEARCH_KEYS or not value:
            raise bad_request("Invalid chat search query.", f'Invalid search term "{word}".')
        terms[key] = value.lower() if key == "archived" else value
    if terms.get("archived", "false") not in ("true", "false"):
        raise bad_request("Invalid chat search query.", 'archived must be "true" or "false".')
    return terms


def _label_filters(raw: list[str]) -> list[tuple[str, str]]:
    out = []
    for item in raw:
        key, sep, value = item.partition(":")
        if not sep or not key or not value:
            raise bad_request(
                f'Invalid label filter: "{item}" (expected format key:value, both must be non-empty)'
            )
        out.append((key, value))
    return out


def _page(found: list[Chat], query: Mapping[str, str]) -> list[Chat]:
    limit = _non_negative(query.get("limit"), "limit")
    offset = _non_negative(query.get("offset"), "offset")
    after = query.get("after_id")
    if after:
        try:
            after_id = uuid.UUID(after)
        except ValueError:
            raise bad_request('Query param "after_id" must be a valid UUID.') from None
        index = next((i for i, c in enumerate(found) if c.id == after_id), None)
        if index is None:
            raise bad_request('Query param "after_id" must name a chat on the list.')
        found = found[index + 1 :]
    found = found[offset:]
    return found[:limit] if limit else found


def _non_negative(raw: str | None, name: str) -> int:
    try:
        value = int(raw) if raw else 0
    except ValueError:
        raise bad_request(f'Query param "{name}" must be a valid integer.') from None
    if value < 0:
        raise bad_request(f'Query param "{name}" must be a non-negative integer.')
    return value


def message_page(chat: Chat, query: QueryParams) -> JSON:
    """Newest first by default; ascending when only ``after_id`` is given (3.6)."""
    limit = int_param(query.get("limit"), "limit")
    if limit is None:
        limit = 50
    if not 1 <= limit <= 200:
        raise bad_request("Invalid limit parameter (1-200).")
    before = int_param(query.get("before_id"), "before_id")
    after = int_param(query.get("after_id"), "after_id")
    if before is not None and after is not None and after >= before:
        raise bad_request("after_id must be less than before_id.")
    rows = [
        m
        for m in chat.visible_messages()
        if (before is None or m.id < before) and (after is None or m.id > after)
    ]
    if before is not None or after is None:
        rows.reverse()
    page = rows[: limit + 1]
    cursorless = before is None and after is None
    return {
        "messages": [m.to_wire() for m in page[:limit]],
        "queued_messages": [q.to_wire() for q in chat.queue] if cursorless else [],
        "has_more": len(page) > limit,
    }
