"""One plain turn end to end over real sockets: the canonical timeline 5.7.1."""

from __future__ import annotations

from coder_chat.simulator import Simulator

from .streams import STREAMED_ANSWER
from .wire import Wire, collapse_parts, kinds


async def test_plain_turn_timeline(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat = await wire.create("hello there /sleep 0.1 /deltas 3")
        async with wire.stream(chat["id"]) as reader:
            await reader.until_status("waiting")
        assert collapse_parts(kinds(reader.events)) == [
            "message:user",
            "status:running",
            *STREAMED_ANSWER,
            "status:waiting",
        ]
        parts = [e for e in reader.events if e["type"] == "message_part"]
        assert [p["message_part"]["seq"] for p in parts] == [1, 2, 3]
        text = "".join(p["message_part"]["part"]["text"] for p in parts)
        final = next(
            e
            for e in reader.events
            if e["type"] == "message" and e["message"]["role"] == "assistant"
        )
        assert final["message"]["content"] == [{"type": "text", "text": text}]
        assert text == 'You said: "hello there"'
