"""What the stream and watch tests share: a settled chat, the events read, a watcher."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import websockets
from websockets.asyncio.client import ClientConnection

from coder_chat.simulator import Simulator

from .wire import Event, Reader, Wire, collapse_parts, kinds

ASK = {
    "name": "ask_user",
    "description": "Ask the human a question.",
    "input_schema": {"type": "object", "properties": {"question": {"type": "string"}}},
}


async def settled_chat(
    sim: Simulator, wire: Wire, text: str = "warm up", **extra: Any
) -> tuple[str, int]:
    """Create a chat, let its first turn finish; return its id and newest message id."""
    chat = await wire.create(text, **extra)
    await sim.wait_for_status(chat["id"], "waiting")
    return str(chat["id"]), sim.messages(chat["id"])[-1].id


#: A turn's answer as the stream shows it: the preview reset, the answer's parts streamed,
#: the assistant message committed, and the preview reset again.
STREAMED_ANSWER = ("preview_reset", "message_part*", "message:assistant", "preview_reset")
#: A turn that ends calling a client tool: its assistant message (the call) committed,
#: then the chat waits for the tool's result.
TOOL_CALL = (
    "preview_reset",
    "message:assistant",
    "preview_reset",
    "status:requires_action",
    "action_required",
)


def of_type(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e["type"] == kind]


def committed(events: list[Event], role: str) -> list[dict[str, Any]]:
    """The ``message`` payloads of one role, in stream order."""
    return [e["message"] for e in of_type(events, "message") if e["message"]["role"] == role]


def delta_text(events: list[Event]) -> str:
    return "".join(
        e["message_part"]["part"].get("text", "") for e in of_type(events, "message_part")
    )


def text_of(message: dict[str, Any]) -> str:
    return "".join(p["text"] for p in message["content"] if p["type"] == "text")


def since(reader: Reader, mark: int) -> list[str]:
    """The collapsed kind trace of the events read after ``mark``."""
    return collapse_parts(kinds(reader.events[mark:]))


@dataclass(frozen=True)
class Told:
    """What a prompt sent to a settled chat did: the answer to the send, and the events
    its stream delivered from then until the turn ended."""

    response: httpx.Response
    events: list[Event]

    def trace(self) -> list[str]:
        """The collapsed kind trace of those events."""
        return collapse_parts(kinds(self.events))


async def told(wire: Wire, chat_id: str, after_id: int, text: str, until: str = "waiting") -> Told:
    """Send ``text`` to a settled chat watched from ``after_id`` on, to status ``until``."""
    async with wire.stream(chat_id, after_id=after_id) as reader:
        await reader.frame()
        mark = len(reader.events)
        response = await wire.send(chat_id, text)
        await reader.until_status(until)
    return Told(response, reader.events[mark:])


WatchEvent = dict[str, Any]


class Watch:
    """A ``/watch`` socket that keeps every event it read."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[WatchEvent] = []

    async def next(self, timeout: float = 5.0) -> WatchEvent:
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        event = json.loads(raw)
        assert isinstance(event, dict), f"watch frames are single objects, got {event!r}"
        self.events.append(event)
        return event

    async def until(self, predicate: Callable[[WatchEvent], bool]) -> WatchEvent:
        while True:
            event = await self.next()
            if predicate(event):
                return event

    def trace(self, chat_id: str) -> list[tuple[str, str]]:
        return [(e["kind"], e["chat"]["status"]) for e in self.events if e["chat"]["id"] == chat_id]


@asynccontextmanager
async def watching(wire: Wire) -> AsyncIterator[Watch]:
    url = wire.ws_url(f"{wire.prefix}/watch")
    async with websockets.connect(url, additional_headers=wire.headers) as ws:
        yield Watch(ws)
