"""A turn's usage: summed over its steps, cached input added back like the reference SDK."""

from __future__ import annotations

from coder_chat.protocol.models import ChatMessage, MessageEvent, Usage
from coder_chat.protocol.translator import TurnTranslator


def message(id: int, role: str, usage: Usage | None = None) -> MessageEvent:
    return MessageEvent(
        type="message",
        message=ChatMessage(
            id=id, chat_id="c", role=role, content=[{"type": "text", "text": "x"}], usage=usage
        ),
    )


def test_usage_sums_steps_and_adds_cached_input_back() -> None:
    translator = TurnTranslator(client_tools=frozenset(), anchor_id=1)
    translator.ingest(message(1, "user"))
    translator.ingest(
        message(
            2,
            "assistant",
            Usage(input_tokens=10, output_tokens=5, total_tokens=15, cache_read_tokens=100),
        )
    )
    translator.ingest(
        message(
            3,
            "assistant",
            Usage(input_tokens=4, output_tokens=6, total_tokens=10, cache_creation_tokens=7),
        )
    )
    usage = translator.usage()
    assert (usage.input_tokens, usage.output_tokens) == (121, 11)
    assert (usage.cache_read_tokens, usage.cache_creation_tokens) == (100, 7)
    assert usage.total_tokens == 132
