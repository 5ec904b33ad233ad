"""Test helpers that speak the wire with plain httpx and websockets (not our client)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import websockets
from websockets.asyncio.client import ClientConnection

from coder_chat.simulator import Simulator

V2 = "/api/v2/chats"
EXP = "/api/experimental/chats"
Event = dict[str, Any]


def declare(*names: str) -> dict[str, Any]:
    """``unsafe_dynamic_tools`` declaring client tools by name, for ``Wire.create``."""
    return {"unsafe_dynamic_tools": [{"name": n, "input_schema": {}} for n in names]}


class Wire:
    """A bare HTTP + WebSocket peer of the simulator."""

    def __init__(self, sim: Simulator, prefix: str = V2) -> None:
        self.sim = sim
        self.prefix = prefix
        self.headers = {"Coder-Session-Token": sim.token}
        self.http = httpx.AsyncClient(base_url=sim.base_url, headers=self.headers, timeout=10)

    async def __aenter__(self) -> Wire:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    def create_body(self, text: str, **extra: Any) -> dict[str, Any]:
        return {
            "organization_id": str(self.sim.organization_id),
            "content": [{"type": "text", "text": text}],
            **extra,
        }

    async def create(self, text: str, **extra: Any) -> dict[str, Any]:
        response = await self.http.post(self.prefix, json=self.create_body(text, **extra))
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        return body

    async def create_settled(self, text: str, **extra: Any) -> str:
        """A new chat whose first turn has ended (``waiting``): its id."""
        chat_id = str((await self.create(text, **extra))["id"])
        await self.sim.wait_for_status(chat_id, "waiting")
        return chat_id

    async def send(self, chat_id: str, text: str, **extra: Any) -> httpx.Response:
        body = {"content": [{"type": "text", "text": text}], **extra}
        return await self.http.post(f"{self.prefix}/{chat_id}/messages", json=body)

    async def messages(self, chat_id: str, **params: Any) -> dict[str, Any]:
        response = await self.http.get(f"{self.prefix}/{chat_id}/messages", params=params)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def settled(self, chat_id: str) -> list[tuple[str, str]]:
        """The chat's whole history once its turns are done, as (role, text) pairs."""
        await self.sim.wait_for_status(chat_id, "waiting")
        page = await self.messages(chat_id, after_id=0)
        return [(m["role"], text_of(m)) for m in page["messages"]]

    def ws_url(self, path: str) -> str:
        return self.sim.base_url.replace("http://", "ws://", 1) + path

    @asynccontextmanager
    async def stream(self, chat_id: str, after_id: int | None = None) -> AsyncIterator[Reader]:
        query = f"?after_id={after_id}" if after_id is not None else ""
        url = self.ws_url(f"{self.prefix}/{chat_id}/stream{query}")
        async with websockets.connect(url, additional_headers=self.headers) as ws:
            yield Reader(ws)


class Reader:
    """Reads JSON-array frames and keeps every event seen, in order."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[Event] = []
        self.frames: list[list[Event]] = []

    async def frame(self, timeout: float = 5.0) -> list[Event]:
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        frame = json.loads(raw)
        assert isinstance(frame, list), f"frames are JSON arrays, got {frame!r}"
        self.frames.append(frame)
        self.events.extend(frame)
        return frame

    async def until(self, predicate: Callable[[Event], bool], timeout: float = 5.0) -> Event:
        """Read frames until an event matches; return that event."""
        start = len(self.events)
        async with asyncio.timeout(timeout):
            while True:
                for event in self.events[start:]:
                    if predicate(event):
                        return event
                start = len(self.events)
                await self.frame(timeout)

    async def until_status(self, status: str, timeout: float = 5.0) -> Event:
        return await self.until(
            lambda e: e["type"] == "status" and e["status"]["status"] == status, timeout
        )


def kinds(events: list[Event]) -> list[str]:
    """A compact trace: ``message:user``, ``status:running``, ``message_part``…"""
    out = []
    for event in events:
        kind = event["type"]
        if kind == "message":
            out.append(f"message:{event['message']['role']}")
        elif kind == "status":
            out.append(f"status:{event['status']['status']}")
        else:
            out.append(kind)
    return out


def collapse_parts(trace: list[str]) -> list[str]:
    """Fold runs of ``message_part`` into one ``message_part*`` entry."""
    out: list[str] = []
    for item in trace:
        if item == "message_part" and out and out[-1] == "message_part*":
            continue
        out.append("message_part*" if item == "message_part" else item)
    return out


#: Coder's message for a chat (or a resource) the caller cannot see.
NOT_FOUND = "Resource not found or you do not have access to this resource"


def text_of(message: dict[str, Any]) -> str:
    """A message's text parts, joined."""
    return "".join(p.get("text", "") for p in message["content"] if p["type"] == "text")


def expect_error(
    response: httpx.Response, status: int, message: str, detail: str | None = None
) -> dict[str, Any]:
    """Assert Coder's error body: the status, the verbatim message and (if given) detail."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["message"] == message
    if detail is not None:
        assert body.get("detail") == detail
    return body


async def turn_events(reader: Reader, end_status: str) -> list[Event]:
    """Events from the next ``status: running`` through the next ``status: end_status``."""
    start = len(reader.events)
    async with asyncio.timeout(5):
        while True:
            trace = kinds(reader.events[start:])
            if "status:running" in trace:
                begin = trace.index("status:running")
                if f"status:{end_status}" in trace[begin:]:
                    end = trace.index(f"status:{end_status}", begin)
                    return reader.events[start + begin : start + end + 1]
            await reader.frame()
