"""The HTTP and WebSocket surface: Coder's chat routes over the :class:`Engine`.

Every chat route is mounted under ``/api/v2/chats`` and ``/api/experimental/chats``.
Each request passes the same gates: authentication, then the fault plan (a
scripted failure, a hold before the effect), the effect itself, then a hold
after the effect (where a crash test can kill the client, or the simulator can
cut the connection so the response never arrives).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from . import sniff
from .engine import Engine
from .errors import ApiError, bad_request, not_found
from .faults import Phase
from .listing import list_chats, message_page
from .records import RequestRecord
from .spending import chat_cost
from .state import JSON, StoredFile

#: Called with a connection's client address to cut it without a response.
T = TypeVar("T")
Cutter = Callable[[tuple[str, int] | None], None]
Handler = Callable[[Request], Awaitable[Response]]

MAX_CREATE_BODY = 256 * 1024
MAX_FILE = 10 * 1024 * 1024
FRAME_EVENTS = 256


class Dropped(Exception):
    """The fault plan cut this request's connection; send nothing."""


class ChatApi:
    """Route handlers bound to one engine."""

    def __init__(self, engine: Engine, cut: Cutter) -> None:
        self.engine = engine
        self.cut = cut

    # -- gates ---------------------------------------------------------------
    def authenticate(self, conn: HTTPConnection) -> None:
        token = (
            conn.headers.get("coder-session-token")
            or conn.cookies.get("coder_session_token")
            or conn.query_params.get("coder_session_token")
        )
        if not token:
            raise ApiError(401, "Authentication required.", "Send the Coder-Session-Token header.")
        if not secrets.compare_digest(token.encode(), self.engine.config.token.encode()):
            raise ApiError(
                401, "Invalid session token.", "The session token is not valid or has expired."
            )

    def check_prefix(self, conn: HTTPConnection) -> None:
        if self.engine.config.era_b.experimental_routes_only and conn.url.path.startswith(
            "/api/v2/"
        ):
            raise ApiError(404, "Route not found.")

    async def gate(
        self, request: Request, route: str, phase: Phase, chat_id: uuid.UUID | None
    ) -> None:
        faults = self.engine.faults
        if phase == "before":
            status = faults.take_failure(route)
            if status is not None:
                raise ApiError(
                    status,
                    f"Simulated failure ({status}).",
                    "Injected by the simulator's fault plan.",
                )
        rule = faults.take_hold(route, phase, chat_id)
        if rule is None:
            return
        if phase == "before" and rule.action != "drop":
            # The server has the request before it commits: read the body now, so a
            # client that gives up (or dies) during the hold cannot take it back.
            await request.body()
        outcome = await faults.wait_decision(rule, route, request.method, request.url.path, chat_id)
        if outcome == "drop":
            self.cut(request.client and (request.client.host, request.client.port))
            raise Dropped

    def endpoint(self, route: str, effect: Callable[[Request], Awaitable[Response]]) -> Handler:
        async def handle(request: Request) -> Response:
            status = 500
            try:
                self.authenticate(request)
                self.check_prefix(request)
                chat_id = _path_chat_id(request)
                await self.gate(request, route, "before", chat_id)
                response = await effect(request)
                await self.gate(request, route, "after", chat_id)
                status = response.status_code
                return response
            except ApiError as exc:
                status = exc.status
                return JSONResponse(exc.body(), status_code=exc.status)
            except Dropped:
                status = 0
                return Response(status_code=499)
            finally:
                self.engine.records.requests.append(
                    RequestRecord(request.method, route, request.url.path, status)
                )

        return handle

    # -- chats ------------------------------------------------------------------
    async def list_chats(self, request: Request) -> Response:
        chats = list_chats(self.engine.chats.values(), request.query_params)
        return JSONResponse([c.to_wire() for c in chats])

    async def create_chat(self, request: Request) -> Response:
        body = await _json_body(request, MAX_CREATE_BODY)
        chat = self.engine.create_chat(body)
        return JSONResponse(chat.to_wire(), status_code=201)

    async def get_chat(self, request: Request) -> Response:
        return JSONResponse(self._chat(request).to_wire())

    async def update_chat(self, request: Request) -> Response:
        self.engine.update_chat(self._chat(request), await _json_body(request))
        return Response(status_code=204)

    async def chat_cost(self, request: Request) -> Response:
        return JSONResponse(chat_cost(self._chat(request), ()))

    async def get_messages(self, request: Request) -> Response:
        return JSONResponse(message_page(self._chat(request), request.query_params))

    async def send_message(self, request: Request) -> Response:
        chat = self._chat(request)
        if chat.archived:  # checked before the body is read, as the server does
            raise bad_request("Cannot send messages to an archived chat.")
        return JSONResponse(self.engine.send_message(chat, await _json_body(request)))

    async def interrupt(self, request: Request) -> Response:
        chat = self.engine.interrupt(self._chat(request))
        return JSONResponse(chat.to_wire())

    async def tool_results(self, request: Request) -> Response:
        self.engine.submit_tool_results(self._chat(request), await _json_body(request))
        return Response(status_code=204)

    async def delete_queued(self, request: Request) -> Response:
        self.engine.delete_queued(self._chat(request), _queued_id(request))
        return Response(status_code=204)

    async def promote_queued(self, request: Request) -> Response:
        self.engine.promote_queued(self._chat(request), _queued_id(request))
        return JSONResponse({"message": "Queued message promotion accepted."}, status_code=202)

    def _chat(self, request: Request) -> Any:
        chat_id = _path_chat_id(request)
        assert chat_id is not None
        return self.engine.chat(chat_id)

    # -- files and models ---------------------------------------------------------
    async def upload_file(self, request: Request) -> Response:
        org_raw = request.query_params.get("organization")
        if not org_raw:
            raise bad_request("Missing organization query parameter.")
        try:
            org = uuid.UUID(org_raw)
        except ValueError:
            raise bad_request("Invalid organization ID.") from None
        if org != self.engine.config.organization_id:
            raise ApiError(403, "You are not a member of the specified organization.")
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type not in sniff.ALLOWED:
            raise bad_request(
                "Unsupported file type.", "Allowed types: " + ", ".join(sorted(sniff.ALLOWED)) + "."
            )
        data = await _read_capped(request, MAX_FILE)
        if not sniff.matches(media_type, data[:512]):
            raise bad_request("File content type does not match Content-Type header.")
        cfg = self.engine.config
        name = sniff.filename(request.headers.get("content-disposition", ""))
        stored = StoredFile(uuid.uuid4(), org, cfg.owner_id, name, media_type, data)
        self.engine.files[stored.id] = stored
        return JSONResponse({"id": str(stored.id)}, status_code=201)

    async def get_file(self, request: Request) -> Response:
        try:
            stored = self.engine.files.get(uuid.UUID(request.path_params["file"]))
        except ValueError:
            stored = None
        if stored is None:
            raise not_found()
        headers = {
            "Content-Disposition": f'inline; filename="{stored.name}"',
            "Cache-Control": "private, max-age=31536000, immutable",
        }
        return Response(stored.data, media_type=stored.mime_type, headers=headers)

    async def model_configs(self, request: Request) -> Response:
        return JSONResponse(self.engine.model_configs)

    async def org_models(self, request: Request) -> Response:
        if request.path_params["org"] != str(self.engine.config.organization_id):
            raise not_found()
        models = [
            {**{k: v for k, v in m.items() if k != "provider"}, "ai_provider_id": _PROVIDER_ID}
            for m in self.engine.model_configs
        ]
        providers = [
            {"id": _PROVIDER_ID, "type": "simulator", "display_name": "Simulator", "enabled": True}
        ]
        return JSONResponse({"models": models, "providers": providers, "unsupported_providers": []})

    async def reserved(self, request: Request) -> Response:
        # Not wrapped by ``endpoint``: answer the error here instead of raising it,
        # which would escape as a 500. Authentication still comes first.
        try:
            self.authenticate(request)
            raise ApiError(404, "Route not found.")
        except ApiError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)

    # -- WebSockets -----------------------------------------------------------------
    async def stream(self, ws: WebSocket) -> None:
        engine = self.engine

        def opening() -> tuple[Any, int]:
            return engine.chat(_ws_chat_id(ws)), _after_id(ws.query_params.get("after_id"))

        admitted = await self._admitted(ws, "stream", opening)
        if admitted is None:
            return
        chat, after_id = admitted
        # Subscribe before the upgrade (wire reference 5.1): once the client sees the
        # 101, every later change reaches this socket.
        subscriber = engine.subscribe(chat, after_id)
        try:
            await ws.accept()
            self._record(ws, "stream", 101)
            budget = engine.faults.stream_drop_after(chat.id)
            await _pump(
                ws, subscriber.wake, lambda: subscriber.take(FRAME_EVENTS), budget, self._cutter(ws)
            )
        finally:
            engine.unsubscribe(subscriber)

    async def watch(self, ws: WebSocket) -> None:
        if await self._admitted(ws, "watch", lambda: True) is None:
            return
        queue: asyncio.Queue[JSON] = asyncio.Queue()
        self.engine.watchers.add(queue)  # before the upgrade, so no event slips past
        try:
            await ws.accept()
            self._record(ws, "watch", 101)
            await _pump_watch(ws, queue)
        finally:
            self.engine.watchers.discard(queue)

    async def _admitted(self, ws: WebSocket, route: str, opening: Callable[[], T]) -> T | None:
        """A socket's checks before its upgrade, in the server's order (auth, prefix, what
        ``opening`` reads, then an injected failure); a refusal is answered and ``None``."""
        try:
            self.authenticate(ws)
            self.check_prefix(ws)
            opened = opening()
            status = self.engine.faults.take_failure(route)
            if status is not None:
                raise ApiError(status, f"Simulated failure ({status}).")
            return opened
        except ApiError as exc:
            self._record(ws, route, exc.status)
            await ws.send_denial_response(JSONResponse(exc.body(), status_code=exc.status))
            return None

    def _cutter(self, ws: WebSocket) -> Callable[[], None]:
        client = ws.client
        return lambda: self.cut(client and (client.host, client.port))

    def _record(self, ws: WebSocket, route: str, status: int) -> None:
        self.engine.records.requests.append(RequestRecord("GET", route, ws.url.path, status))


async def _pump(
    ws: WebSocket,
    wake: asyncio.Event,
    take: Callable[[], list[JSON]],
    budget: int | None,
    cut: Callable[[], None],
) -> None:
    """Send queued events as JSON-array frames until the client leaves or a drop fires."""
    sent = 0
    async with _client_reader(ws) as reader:
        while True:
            if budget is not None and sent >= budget:
                cut()
                return
            if await _unless_closed(reader, wake.wait()) is None:
                return
            batch = take()
            if budget is not None:
                batch = batch[: budget - sent]  # the rest is lost with the socket
            if batch:
                await ws.send_text(json.dumps(batch, separators=(",", ":")))
                sent += len(batch)


@contextlib.asynccontextmanager
async def _client_reader(ws: WebSocket) -> AsyncIterator[asyncio.Future[None]]:
    """The client's side of a server-only socket, read until the client goes; a socket
    that breaks ends the pump inside quietly."""
    reader = asyncio.ensure_future(_await_close(ws))
    try:
        yield reader
    except (WebSocketDisconnect, RuntimeError, OSError):
        return
    finally:
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader


async def _unless_closed(reader: asyncio.Future[None], waiting: Awaitable[T]) -> T | None:
    """What ``waiting`` gives, or ``None`` once the client went first."""
    task = asyncio.ensure_future(waiting)
    racing: set[asyncio.Future[Any]] = {reader, task}
    done, _ = await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
    if reader in done:
        task.cancel()
        return None
    return task.result()


async def _await_close(ws: WebSocket) -> None:
    """Read until the client goes; a client data frame breaks the server-only protocol."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        if message.get("text") is not None or message.get("bytes") is not None:
            await ws.close(code=1008, reason="the stream is read-only")
            return


async def _pump_watch(ws: WebSocket, queue: asyncio.Queue[JSON]) -> None:
    async with _client_reader(ws) as reader:
        while (event := await _unless_closed(reader, queue.get())) is not None:
            await ws.send_text(json.dumps(event, separators=(",", ":")))


async def _json_body(request: Request, cap: int | None = None) -> JSON:
    raw = await _read_capped(request, cap) if cap else await request.body()
    try:
        body = json.loads(raw or b"{}")
    except json.JSONDecodeError as exc:
        raise bad_request("Request body must be valid JSON.", str(exc)) from None
    if not isinstance(body, dict):
        raise bad_request("Request body must be a JSON object.")
    return body


async def _read_capped(request: Request, cap: int | None) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if cap is not None and size > cap:
            if cap == MAX_FILE:
                raise ApiError(413, "File too large.", f"Maximum file size is {MAX_FILE} bytes.")
            raise ApiError(413, "Request body too large.", f"Maximum body size is {cap} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


def _path_chat_id(conn: HTTPConnection) -> uuid.UUID | None:
    raw = conn.path_params.get("chat")
    if raw is None:
        return None
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise ApiError(400, f'Invalid UUID "{raw}".', "The chat ID must be a valid UUID.") from None


def _ws_chat_id(ws: WebSocket) -> uuid.UUID:
    chat_id = _path_chat_id(ws)
    assert chat_id is not None
    return chat_id


_INT64 = re.compile(r"-?\d{1,19}")


def _after_id(raw: str | None) -> int:
    # Strict like Go's strconv.ParseInt: no spaces, no underscores, within int64.
    if raw is None or raw == "":
        return 0
    if not _INT64.fullmatch(raw) or not -(2**63) <= int(raw) < 2**63:
        raise bad_request("Invalid after_id parameter.")
    return int(raw)


def _queued_id(request: Request) -> int:
    try:
        return int(request.path_params["queued"])
    except ValueError:
        raise ApiError(404, "Queued message not found.") from None


_PROVIDER_ID = "00000000-0000-0000-0000-0000000000aa"


def chat_routes(api: ChatApi, prefix: str, *, experimental: bool) -> list[BaseRoute]:
    """The chat routes under one prefix (``/api/v2/chats`` or ``/api/experimental/chats``)."""
    e, p = api.endpoint, prefix
    routes: list[BaseRoute] = [
        Route(p, e("list_chats", api.list_chats), methods=["GET"]),
        Route(p, e("create_chat", api.create_chat), methods=["POST"]),
        WebSocketRoute(f"{p}/watch", api.watch),
        Route(f"{p}/files", e("upload_file", api.upload_file), methods=["POST"]),
        Route(f"{p}/files/{{file}}", e("get_file", api.get_file), methods=["GET"]),
    ]
    if experimental:
        routes.append(
            Route(f"{p}/model-configs", e("model_configs", api.model_configs), methods=["GET"])
        )
    else:
        routes += [
            Route(f"{p}/{seg}", api.reserved, methods=["GET"])
            for seg in ("model-configs", "models")
        ]
    c = f"{p}/{{chat}}"
    routes += [
        Route(c, e("get_chat", api.get_chat), methods=["GET"]),
        Route(c, e("update_chat", api.update_chat), methods=["PATCH"]),
        Route(f"{c}/cost", e("chat_cost", api.chat_cost), methods=["GET"]),
        Route(f"{c}/messages", e("get_messages", api.get_messages), methods=["GET"]),
        Route(f"{c}/messages", e("send_message", api.send_message), methods=["POST"]),
        Route(f"{c}/interrupt", e("interrupt", api.interrupt), methods=["POST"]),
        Route(f"{c}/tool-results", e("tool_results", api.tool_results), methods=["POST"]),
        Route(f"{c}/queue/{{queued}}", e("delete_queued", api.delete_queued), methods=["DELETE"]),
        Route(
            f"{c}/queue/{{queued}}/promote",
            e("promote_queued", api.promote_queued),
            methods=["POST"],
        ),
        WebSocketRoute(f"{c}/stream", api.stream),
    ]
    return routes
