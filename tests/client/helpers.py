"""Shared helpers for the client suite: real sockets against the simulator, small timers."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from coder_chat import ChatClient, ChatOptions, ChatSession, SessionHooks
from coder_chat.client.events import (
    SegmentSettle,
    SegmentStart,
    TransportCallback,
    TransportEvent,
    WsDial,
    WsEvent,
    WsRedial,
)
from coder_chat.client.turn import BeforeAction, BeforeInterrupt, no_check, no_record
from coder_chat.simulator import Simulator

#: Timers small enough that every window of the client takes milliseconds.
FAST: dict[str, Any] = {
    "redial_initial": 0.01,
    "action_grace": 0.2,
    "archive_retry_interval": 0.05,
    "archive_window": 5.0,
    "interrupt_timeout": 5.0,
    "request_timeout": 15.0,
}


@dataclass
class Recorder:
    """A transport-event callback that keeps every event it is handed."""

    events: list[TransportEvent] = field(default_factory=list)

    def __call__(self, event: TransportEvent) -> None:
        self.events.append(event)

    def of(self, kind: str) -> list[TransportEvent]:
        return [e for e in self.events if e.type == kind]

    def dials(self) -> list[WsDial]:
        return [e for e in self.events if isinstance(e, WsDial)]

    def redials(self) -> list[WsRedial]:
        return [e for e in self.events if isinstance(e, WsRedial)]

    def starts(self) -> list[SegmentStart]:
        return [e for e in self.events if isinstance(e, SegmentStart)]

    def settles(self) -> list[SegmentSettle]:
        return [e for e in self.events if isinstance(e, SegmentSettle)]

    def ws_events(self) -> list[WsEvent]:
        return [e for e in self.events if isinstance(e, WsEvent)]

    def ops(self) -> list[str]:
        return [getattr(e, "op", "") for e in self.events if e.type == "http:request"]


def client_for(sim: Simulator, **overrides: Any) -> ChatClient:
    options: dict[str, Any] = {"retry_delay": 0.01, "timeout": 10.0}
    options.update(overrides)
    return ChatClient(base_url=sim.base_url, token=sim.token, **options)


#: What ``session_for`` hands the session itself, not its options.
_POINTER = ("chat_id", "last_seen_message_id", "tools")


def session_for(
    sim: Simulator,
    *,
    client: ChatClient | None = None,
    on_transport_event: TransportCallback | None = None,
    before_action: BeforeAction = no_check,
    before_interrupt: BeforeInterrupt = no_record,
    story: Callable[[str], None] | None = None,
    **overrides: Any,
) -> ChatSession:
    """A session on the simulator with fast timers: ``overrides`` name its pointer (chat,
    cursor, tools) or its options' fields, and win over the fast timers."""
    pointer = {k: overrides.pop(k) for k in _POINTER if k in overrides}
    options = ChatOptions(**{**FAST, **overrides})
    hooks = SessionHooks(before_action, story=story, before_interrupt=before_interrupt)
    if client is None:
        return ChatSession.connect(
            sim.base_url,
            sim.token,
            str(sim.organization_id),
            options=options,
            on_transport_event=on_transport_event,
            hooks=hooks,
            **pointer,
        )
    return ChatSession(client, str(sim.organization_id), options=options, hooks=hooks, **pointer)


def session_with_client(
    sim: Simulator, recorder: Recorder | None = None, **overrides: Any
) -> ChatSession:
    """A session whose client retries reads fast (the session's own client keeps 0.5 s)."""
    client = client_for(sim, on_transport_event=recorder)
    return session_for(sim, client=client, **overrides)


async def eventually(
    predicate: Callable[[], bool], *, timeout: float = 10.0, interval: float = 0.005
) -> None:
    """Poll until ``predicate()`` holds (fails the test after ``timeout``)."""
    async with asyncio.timeout(timeout):
        # Simulator state lives in plain records, not behind an event: poll it.
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(interval)


async def idle_chat(sim: Simulator, prompt: str = "warm up") -> str:
    """A chat with one finished exchange, created over the wire."""
    async with client_for(sim) as client:
        chat = await client.create_chat(organization_id=str(sim.organization_id), content=prompt)
    await sim.wait_for_status(chat.id, "waiting")
    return chat.id


def committed_assistant_text(sim: Simulator, chat_id: str) -> list[str]:
    return [m.text() for m in sim.messages(chat_id) if m.role == "assistant"]


def requests_of(sim: Simulator, route: str) -> list[Any]:
    return [r for r in sim.records.requests if r.route == route]


def token_free(token: str, things: Iterable[object]) -> list[str]:
    """Every ``str``/``repr`` of ``things`` that leaks ``token`` (should be empty)."""
    leaks = []
    for thing in things:
        for text in (str(thing), repr(thing)):
            if token in text:
                leaks.append(text)
    return leaks


# -- a tiny server of our own, for frames the simulator never sends ----------------------------

FrameScript = Callable[[ServerConnection], Awaitable[None]]
HttpScript = Callable[[Request], Response]


def http_response(status: int, body: bytes, content_type: str = "application/json") -> Response:
    headers = Headers({"Content-Type": content_type, "Connection": "close"})
    headers["Content-Length"] = str(len(body))
    return Response(status, HTTPStatus(status).phrase, headers, body)


def _empty_list(request: Request) -> Response:
    return http_response(200, b"[]")


@contextlib.asynccontextmanager
async def frame_server(
    script: FrameScript | None = None, http: HttpScript = _empty_list
) -> AsyncIterator[str]:
    """A WebSocket server of our own on a free port, for frames the simulator never sends.

    Plain HTTP requests (the prefix probe) are answered by ``http`` (default: 200
    ``[]``); a WebSocket upgrade runs ``script``.
    """

    def process_request(connection: ServerConnection, request: Request) -> Response | None:
        if request.headers.get("Upgrade", "").lower() == "websocket" and script is not None:
            return None
        return http(request)

    async def handler(connection: ServerConnection) -> None:
        assert script is not None
        await script(connection)

    server: Server = await serve(handler, "127.0.0.1", 0, process_request=process_request)
    try:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


def frame(*events: dict[str, Any]) -> str:
    return json.dumps(list(events))
