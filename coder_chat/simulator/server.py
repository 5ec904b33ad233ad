"""Serving the simulator: in-process for tests and the demo, or as a command.

``serve_simulator()`` starts uvicorn on a free loopback port inside the running
event loop and yields a :class:`Simulator` handle: the base URL and token a
client needs, plus the fault plan, the configuration and the ground-truth
records for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from . import control
from .admin import admin_routes
from .config import SimulatorConfig
from .engine import Engine, Script
from .faults import FaultPlan
from .http import ChatApi, Cutter, chat_routes
from .records import Records
from .state import Chat, Message


def build_app(engine: Engine, cut: Any) -> Starlette:
    """The whole ASGI app: both chat prefixes, the org model listing, the admin routes."""
    api = ChatApi(engine, cut)

    async def not_found(request: Request, exc: Exception) -> Response:
        return JSONResponse({"message": "Route not found."}, status_code=404)

    routes: list[BaseRoute] = [
        *chat_routes(api, "/api/v2/chats", experimental=False),
        *chat_routes(api, "/api/experimental/chats", experimental=True),
        Route(
            "/api/v2/organizations/{org}/chats/models",
            api.endpoint("model_configs", api.org_models),
            methods=["GET"],
        ),
        Mount("/simulator/v1", routes=admin_routes(engine, api)),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    app.router.redirect_slashes = False
    return app


class InProcessServer(uvicorn.Server):
    """uvicorn without signal handlers (the host process owns its signals) that
    stops at once when asked, instead of on its next 100 ms tick."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self.should_exit = True
        self._stop.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        await self._stop.wait()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Nothing in flight matters any more (tests are done, or the process is
        # stopping): close every connection now rather than waiting for clients.
        for server in self.servers:
            server.close()
        for connection in list(self.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()
        for task in list(self.server_state.tasks):
            task.cancel()


class Simulator:
    """A running simulator: where to reach it, and its controls and records."""

    def __init__(self, engine: Engine, base_url: str) -> None:
        self.engine = engine
        self.base_url = base_url
        # The engine's own, made with it and never replaced: a test changes them in place.
        self.config: SimulatorConfig = engine.config
        self.faults: FaultPlan = engine.faults
        self.records: Records = engine.records

    @property
    def token(self) -> str:
        return self.engine.config.token

    @property
    def organization_id(self) -> uuid.UUID:
        return self.engine.config.organization_id

    @property
    def workspace_id(self) -> uuid.UUID:
        """A workspace the simulator knows, for ``workspace_id`` on create."""
        return sorted(self.engine.workspaces)[0]

    @property
    def mcp_server_id(self) -> uuid.UUID:
        return sorted(self.engine.mcp_servers)[0]

    def env(self) -> dict[str, str]:
        """The three variables a client reads (``CODER_URL`` and friends)."""
        return {
            "CODER_URL": self.base_url,
            "CODER_SESSION_TOKEN": self.token,
            "CODER_ORG_ID": str(self.organization_id),
        }

    def chats(self, *, include_archived: bool = True) -> list[Chat]:
        return [c for c in self.engine.chats.values() if include_archived or not c.archived]

    def chat(self, chat_id: uuid.UUID | str) -> Chat:
        return self.engine.chat(uuid.UUID(str(chat_id)))

    def messages(self, chat_id: uuid.UUID | str) -> list[Message]:
        """The chat's committed, client-visible messages, oldest first."""
        return self.chat(chat_id).visible_messages()

    def script(self, when: str, then: str, times: int | None = None) -> None:
        """Answer every prompt containing ``when`` (or the next ``times`` ones) as if
        ``then`` (directives) were in it:
        ``sim.script("Plan the refund", '/json {"amount_cents": 500}')``."""
        self.engine.scripts.append(Script(when, then, times))

    def seed(self, count: int, **options: Any) -> list[uuid.UUID]:
        return control.seed_chats(self.engine, count, **options)

    def reset_history(self, chat_id: uuid.UUID | str) -> None:
        control.reset_history(self.engine, self.chat(chat_id))

    def revise_message(self, chat_id: uuid.UUID | str, message_id: int, text: str) -> Message:
        return control.revise_message(self.engine, self.chat(chat_id), message_id, text)

    def time_out_tools(self, chat_id: uuid.UUID | str) -> None:
        """Act as if the server-side tool deadline passed now."""
        self.engine.time_out_pending(self.chat(chat_id))

    async def wait_for_status(
        self, chat_id: uuid.UUID | str, *statuses: str, timeout: float = 10.0
    ) -> Chat:
        """Poll the records until the chat reaches one of ``statuses``."""
        chat = self.chat(chat_id)
        async with asyncio.timeout(timeout):
            # Status lives in plain records, not behind an event: poll it.
            while chat.status not in statuses:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        return chat

    def __repr__(self) -> str:
        return f"Simulator(base_url={self.base_url!r})"


def connection_cutter(server: uvicorn.Server) -> Cutter:
    """Aborts the connection of a client (host, port) on ``server``: a fault a test asks
    for, the way a network that drops a socket would cut it."""

    def cut(client: tuple[str, int] | None) -> None:
        for protocol in list(server.server_state.connections):
            if client is not None and getattr(protocol, "client", None) == client:
                transport = getattr(protocol, "transport", None)
                if transport is not None:
                    transport.abort()

    return cut


def _uvicorn_config(app: Starlette, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http="h11",
        ws="websockets-sansio",
        # coderd accepts chat streams with compression disabled: never negotiate it,
        # so frame sizes and decode costs here are the ones a client meets there.
        ws_per_message_deflate=False,
        lifespan="off",
        log_level="warning",
        access_log=False,
        ws_max_size=16 * 1024 * 1024,
        timeout_graceful_shutdown=1,
    )


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit this. asyncio only sets TCP_NODELAY itself when
    # sock.proto is IPPROTO_TCP (it is 0 here), and without it every keep-alive
    # response after the first stalls ~40 ms on Nagle + delayed ACK.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def create(config: SimulatorConfig | None = None) -> tuple[Engine, Starlette, list[uvicorn.Server]]:
    engine = Engine(config or SimulatorConfig(), FaultPlan())
    holder: list[uvicorn.Server] = []
    app = build_app(engine, lambda client: holder and connection_cutter(holder[0])(client))
    return engine, app, holder


@contextlib.asynccontextmanager
async def _running(
    config: SimulatorConfig | None, host: str, port: int
) -> AsyncIterator[tuple[Engine, InProcessServer, asyncio.Task[None], str]]:
    """The simulator served on a socket of its own, once it accepts connections: its
    engine, its server, the task serving, and its base URL. On exit the engine closes
    first (its streams end, so the server's shutdown waits for none), then the server."""
    engine, app, holder = create(config)
    sock = _bind(host, port)
    server = InProcessServer(_uvicorn_config(app, host, port))
    holder.append(server)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.005)
        yield engine, server, task, f"http://{host}:{sock.getsockname()[1]}"
    finally:
        engine.faults.clear()
        await engine.close()
        server.stop()
        await task
        sock.close()


@contextlib.asynccontextmanager
async def serve_simulator(
    config: SimulatorConfig | None = None, *, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[Simulator]:
    """Run the simulator inside this event loop until the block exits."""
    async with _running(config, host, port) as (engine, _, _, url):
        yield Simulator(engine, url)


async def run_forever(config: SimulatorConfig, host: str, port: int, ready: Any) -> None:
    """Serve until SIGINT or SIGTERM (the ``prefect-coder simulator`` command)."""
    async with _running(config, host, port) as (_, server, task, url):
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, server.stop)
        ready(url)
        await task
