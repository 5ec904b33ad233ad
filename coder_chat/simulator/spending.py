"""What the simulated user spent, their usage limit, and a chat's cost (wire reference 2.4).

Coder prices each assistant message (``total_cost_micros`` in its usage, where the
server reports cost) and refuses new work past a user's usage limit for the period:
409 "Chat usage limit exceeded." with ``spent_micros``, ``limit_micros`` and
``resets_at``; a turn already running ends in ``error`` with kind ``usage_limit``.
The simulator keeps one user, one period (from its start, ``usage_period`` seconds
long) and one limit (``usage_limit_micros``; 0: none).

A chat's cost (``GET …/{chat}/cost``) follows the fields of Coder's cost summary
(``ChatCostSummary``: micros, priced and unpriced messages, token totals), for the chat
and its children; the per-chat route's own body was not read, so its shape is ours.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from .errors import ApiError
from .state import JSON, Chat, Message, rfc3339

USAGE_LIMIT_MESSAGE = "Chat usage limit exceeded."


def spent_micros(chats: Iterable[Chat], since: datetime) -> int:
    """What the user's assistant messages since ``since`` cost."""
    return sum(_cost(m) for c in chats for m in c.messages if _priced_since(m, since))


def over_limit(chats: Iterable[Chat], limit: int, since: datetime, period: float) -> JSON | None:
    """Coder's figures when the user's spend reached ``limit`` (0: no limit), else None."""
    if not limit:
        return None
    spent = spent_micros(chats, since)
    if spent < limit:
        return None
    resets = since + timedelta(seconds=period)
    return {"spent_micros": spent, "limit_micros": limit, "resets_at": rfc3339(resets)}


def refuse_over_limit(figures: JSON | None) -> None:
    """Refuse new work, as Coder does, when the limit is reached."""
    if figures is not None:
        raise ApiError(409, USAGE_LIMIT_MESSAGE, **figures)


def limit_error(figures: JSON) -> JSON:
    """The ``last_error`` of a turn the limit ended."""
    return {
        "message": USAGE_LIMIT_MESSAGE,
        "detail": f"spent {figures['spent_micros']} of {figures['limit_micros']} micros; "
        f"resets at {figures['resets_at']}",
        "kind": "usage_limit",
        "retryable": False,
    }


def chat_cost(chat: Chat, children: Iterable[Chat]) -> JSON:
    """``GET …/{chat}/cost``: the chat's own figures, and each child's."""
    return {**_figures(chat), "children": [_figures(c) for c in children]}


def _figures(chat: Chat) -> JSON:
    replies = [m for m in chat.messages if m.role == "assistant"]
    priced = [m for m in replies if (m.usage or {}).get("total_cost_micros") is not None]

    def total(name: str) -> int:
        return sum(int((m.usage or {}).get(name) or 0) for m in replies)

    return {
        "chat_id": str(chat.id),
        "total_cost_micros": sum(_cost(m) for m in priced),
        "priced_message_count": len(priced),
        "unpriced_message_count": len(replies) - len(priced),
        "total_input_tokens": total("input_tokens"),
        "total_output_tokens": total("output_tokens"),
        "total_cache_read_tokens": total("cache_read_tokens"),
        "total_cache_creation_tokens": total("cache_creation_tokens"),
    }


def _cost(message: Message) -> int:
    return int((message.usage or {}).get("total_cost_micros") or 0)


def _priced_since(message: Message, since: datetime) -> bool:
    return message.role == "assistant" and message.created_at >= since
