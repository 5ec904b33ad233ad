"""Token usage as Coder reports it on each committed assistant message (wire reference 2.4).

Each model step is one assistant message carrying that step's usage, so a turn's
consumption is the sum over its assistant messages. A step reads the whole conversation
so far: what earlier turns sent comes from the provider's prompt cache
(``cache_read_tokens``), the rest is ``input_tokens`` (chatd normalises it to the
uncached prompt); so each later step's input grows with the conversation. Its output is
what it writes, tool calls included: a step that only calls tools still spends output
tokens. A token here is a word (a JSON value's words for tool arguments and results),
enough to be consistent and to grow the way a real count grows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from .state import JSON, Chat

#: The system prompt and tool declarations every step reads before the conversation.
PREAMBLE_TOKENS = 10


def step_usage(chat: Chat, content: list[JSON], cost_micros_per_token: int = 0) -> JSON:
    """The usage of the model step about to commit ``content`` to ``chat``, read from
    the messages ``chat`` holds now; ``total_cost_micros`` when a price is set."""
    last_prompt = max((i for i, m in enumerate(chat.messages) if m.role == "user"), default=0)
    cached = sum(_tokens(m.content) for m in chat.messages[:last_prompt])
    fresh = PREAMBLE_TOKENS + sum(_tokens(m.content) for m in chat.messages[last_prompt:])
    output = _tokens(content)
    usage: JSON = {
        "input_tokens": fresh,
        "output_tokens": output,
        "cache_read_tokens": cached,
        "total_tokens": fresh + output,  # chatd's total leaves the cache out, as its input does
    }
    if cost_micros_per_token:
        usage["total_cost_micros"] = (fresh + cached + output) * cost_micros_per_token
    return usage


def _tokens(parts: Iterable[JSON]) -> int:
    return sum(_part_tokens(part) for part in parts)


def _part_tokens(part: JSON) -> int:
    kind = part.get("type")
    if kind == "tool-call":
        return 1 + _words(json.dumps(part.get("args")))
    if kind == "tool-result":
        return 1 + _words(json.dumps(part.get("result")))
    return _words(str(part.get("text", "")))


def _words(text: str) -> int:
    return len(text.split())
