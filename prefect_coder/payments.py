"""A small fake payments service for the demo and the crash tests.

``POST /charges`` with ``{"amount_cents": N}`` and an ``Idempotency-Key`` header
charges once per key: a repeated key answers the first receipt again and
applies nothing. ``GET /charges`` lists what was applied, per key, so a test can
check that every effect happened at most once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from coder_chat.simulator.server import InProcessServer


@dataclass
class Ledger:
    receipts: dict[str, str] = field(default_factory=dict)
    #: How many times each key's charge was *applied* (at most once if keys are honoured).
    applied: dict[str, int] = field(default_factory=dict)
    #: How many requests arrived per key (replays included).
    requests: dict[str, int] = field(default_factory=dict)

    def charge(self, key: str, amount_cents: int) -> str:
        self.requests[key] = self.requests.get(key, 0) + 1
        if key not in self.receipts:
            self.receipts[key] = f"rcpt-{len(self.receipts) + 1}-{amount_cents}"
            self.applied[key] = self.applied.get(key, 0) + 1
        return self.receipts[key]


def build_app(ledger: Ledger) -> Starlette:
    async def charge(request: Request) -> JSONResponse:
        key = request.headers.get("idempotency-key")
        if not key:
            return JSONResponse({"message": "Idempotency-Key header is required."}, status_code=400)
        body = await request.json()
        receipt = ledger.charge(key, int(body["amount_cents"]))
        return JSONResponse({"receipt": receipt})

    async def listing(request: Request) -> JSONResponse:
        return JSONResponse({"applied": ledger.applied, "requests": ledger.requests})

    return Starlette(
        routes=[Route("/charges", charge, methods=["POST"]), Route("/charges", listing)]
    )


@contextlib.asynccontextmanager
async def serve_payments(host: str = "127.0.0.1") -> AsyncIterator[tuple[str, Ledger]]:
    """Run the fake payments service in this event loop; yields its URL and ledger."""
    ledger = Ledger()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, 0))
    config = uvicorn.Config(
        build_app(ledger), log_level="warning", access_log=False, lifespan="off"
    )
    server = InProcessServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.005)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}", ledger
    finally:
        server.stop()
        await task
        sock.close()
