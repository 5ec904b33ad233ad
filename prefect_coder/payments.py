"""A small fake payments service for the demo and the crash tests.

``POST /charges`` with ``{"amount_cents": N}`` and an ``Idempotency-Key`` header
charges once per key: a repeated key answers the first receipt again and
applies nothing. ``GET /charges`` lists what was applied, per key, so a test can
check that every effect happened at most once.

A test can stop a charge in its tracks, like the simulator's hold knob:
``ledger.hold("before")`` holds the next charge before it is applied,
``ledger.hold("after")`` right after; ``await ledger.wait_held()`` reports it,
and ``ledger.decide(id, "release" | "drop")`` lets it go on or cuts its
connection without an answer (a dropped ``before`` charge is never applied).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from coder_chat.simulator.server import InProcessServer, connection_cutter

Phase = Literal["before", "after"]
Outcome = Literal["release", "drop"]


@dataclass
class HeldCharge:
    """A charge stopped at a hold point, waiting for ``release`` or ``drop``."""

    id: int
    key: str
    amount_cents: int
    phase: Phase
    outcome: Outcome | None = None
    _decided: asyncio.Event = field(default_factory=asyncio.Event, repr=False)


@dataclass
class Ledger:
    receipts: dict[str, str] = field(default_factory=dict)
    #: How many times each key's charge was *applied* (at most once if keys are honoured).
    applied: dict[str, int] = field(default_factory=dict)
    #: How many requests arrived per key (replays included).
    requests: dict[str, int] = field(default_factory=dict)
    _holds: list[Phase] = field(default_factory=list, repr=False)
    _held: dict[int, HeldCharge] = field(default_factory=dict, repr=False)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1), repr=False)
    _held_changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def charge(self, key: str, amount_cents: int) -> str:
        self.requests[key] = self.requests.get(key, 0) + 1
        if key not in self.receipts:
            self.receipts[key] = f"rcpt-{len(self.receipts) + 1}-{amount_cents}"
            self.applied[key] = self.applied.get(key, 0) + 1
        return self.receipts[key]

    # -- the hold knob ---------------------------------------------------------------
    def hold(self, phase: Phase = "before", count: int = 1) -> None:
        """Hold the next ``count`` charges at ``phase`` (before or after they are applied)."""
        self._holds.extend([phase] * count)

    def held(self) -> list[HeldCharge]:
        return [h for h in self._held.values() if h.outcome is None]

    async def wait_held(self, timeout: float = 10.0) -> HeldCharge:
        """Wait until a charge is held, and return it."""
        async with asyncio.timeout(timeout):
            while not self.held():
                self._held_changed.clear()
                await self._held_changed.wait()
        return self.held()[0]

    def decide(self, held_id: int, outcome: Outcome) -> HeldCharge:
        held = self._held.pop(held_id)
        held.outcome = outcome
        held._decided.set()
        return held

    def clear(self) -> None:
        """Remove every hold rule and release every held charge."""
        self._holds.clear()
        for held in list(self._held.values()):
            self.decide(held.id, "release")

    async def gate(self, phase: Phase, key: str, amount_cents: int) -> Outcome:
        if phase not in self._holds:
            return "release"
        self._holds.remove(phase)
        held = HeldCharge(next(self._ids), key, amount_cents, phase)
        self._held[held.id] = held
        self._held_changed.set()
        await held._decided.wait()
        assert held.outcome is not None
        return held.outcome


#: Called with a connection's client address to cut it without a response.
Cutter = Callable[[tuple[str, int] | None], None]


def build_app(ledger: Ledger, cut: Cutter | None = None) -> Starlette:
    def dropped(request: Request) -> Response:
        if cut is not None:
            cut(request.client and (request.client.host, request.client.port))
        return Response(status_code=499)

    async def charge(request: Request) -> Response:
        key = request.headers.get("idempotency-key")
        if not key:
            return JSONResponse({"message": "Idempotency-Key header is required."}, status_code=400)
        amount = int((await request.json())["amount_cents"])
        if await ledger.gate("before", key, amount) == "drop":
            return dropped(request)
        receipt = ledger.charge(key, amount)
        if await ledger.gate("after", key, amount) == "drop":
            return dropped(request)
        return JSONResponse({"receipt": receipt})

    async def listing(request: Request) -> JSONResponse:
        return JSONResponse({"applied": ledger.applied, "requests": ledger.requests})

    return Starlette(
        routes=[
            Route("/charges", charge, methods=["POST"]),
            # A refund is booked like a charge: once per idempotency key.
            Route("/refunds", charge, methods=["POST"]),
            Route("/charges", listing),
        ]
    )


@contextlib.asynccontextmanager
async def serve_payments(host: str = "127.0.0.1") -> AsyncIterator[tuple[str, Ledger]]:
    """Run the fake payments service in this event loop; yields its URL and ledger."""
    ledger = Ledger()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, 0))
    servers: list[uvicorn.Server] = []
    app = build_app(
        ledger, lambda client: connection_cutter(servers[0])(client) if servers else None
    )
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = InProcessServer(config)
    servers.append(server)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.005)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}", ledger
    finally:
        ledger.clear()
        server.stop()
        await task
        sock.close()
