"""The admin routes under ``/simulator/v1``: fault knobs and ground truth over HTTP.

They need the same session token as the chat API, and live under a prefix no
Coder client ever builds, so a real client cannot reach them by accident. A
crash test running the client in another process uses them to arm a hold,
wait until the request is held, SIGKILL the client, then release or drop it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from . import control
from .engine import Engine, Script
from .errors import ApiError, bad_request
from .faults import FaultPlan, UnknownRoute
from .http import ChatApi
from .state import Chat

Body = dict[str, Any]
Handler = Callable[[Request], Awaitable[Response]]


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def _opt_uuid(value: Any) -> uuid.UUID | None:
    return uuid.UUID(str(value)) if value else None


def _times(body: Body) -> int | None:
    """``times``: a count, or ``null`` for every time."""
    value = body.get("times", 1)
    return None if value is None else int(value)


def _knobs(faults: FaultPlan) -> dict[str, Callable[[Body], None]]:
    """``POST /faults/{kind}`` bodies, mapped onto the :class:`FaultPlan` methods."""
    return {
        "fail": lambda b: faults.fail_next(b["route"], int(b["status"]), int(b.get("count", 1))),
        "hold": lambda b: faults.hold(
            b["route"], b.get("phase", "after"), int(b.get("count", 1)), _opt_uuid(b.get("chat_id"))
        ),
        "cut": lambda b: (
            faults.cut_before_commit if b.get("phase") == "before" else faults.cut_after_commit
        )(b["route"], int(b.get("count", 1))),
        "delay": lambda b: faults.delay_commit(
            b["route"], float(b["seconds"]), int(b.get("count", 1))
        ),
        "stream-drop": lambda b: faults.drop_streams(
            int(b["after_events"]), _times(b), _opt_uuid(b.get("chat_id"))
        ),
        "withhold-action": lambda b: faults.withhold_action_required(
            _times(b), _opt_uuid(b.get("chat_id"))
        ),
        "retry-generation": lambda b: faults.retry_generation(
            int(b.get("times", 1)), _opt_uuid(b.get("chat_id"))
        ),
    }


class AdminApi:
    """Handlers of the admin routes; each returns JSON-able data."""

    def __init__(self, engine: Engine, api: ChatApi) -> None:
        self.engine = engine
        self.api = api
        self.knobs = _knobs(engine.faults)

    def guarded(self, fn: Callable[[Request, Body], Any]) -> Handler:
        async def handle(request: Request) -> Response:
            try:
                self.api.authenticate(request)
                raw = await request.body()
                result = fn(request, json.loads(raw) if raw else {})
                if inspect.isawaitable(result):
                    result = await result
                return JSONResponse(_jsonable(result))
            except ApiError as exc:
                return JSONResponse(exc.body(), status_code=exc.status)
            except (UnknownRoute, KeyError, ValueError, TypeError) as exc:
                return JSONResponse({"message": f"Bad admin request: {exc}"}, status_code=400)
            except TimeoutError:
                return JSONResponse({"message": "Nothing was held in time."}, status_code=408)

        return handle

    def config(self, request: Request, body: Body) -> Any:
        if request.method == "PATCH":
            self.engine.config.update(body)
        return self.engine.config.public()

    def faults(self, request: Request, body: Body) -> Any:
        if request.method == "DELETE":
            self.engine.faults.clear()
        return self.engine.faults.describe()

    def arm(self, request: Request, body: Body) -> Any:
        kind = request.path_params["kind"]
        if kind not in self.knobs:
            raise bad_request(
                f"unknown fault kind {kind!r}; known: {', '.join(sorted(self.knobs))}"
            )
        self.knobs[kind](body)
        return self.engine.faults.describe()

    def scripts(self, request: Request, body: Body) -> Any:
        if request.method == "DELETE":
            self.engine.scripts.clear()
        elif request.method == "POST":
            times = body.get("times")
            script = Script(
                str(body["when"]), str(body["then"]), None if times is None else int(times)
            )
            self.engine.scripts.append(script)
        return [dataclasses.asdict(script) for script in self.engine.scripts]

    def held(self, request: Request, body: Body) -> Any:
        return [h.to_wire() for h in self.engine.faults.held()]

    async def wait_held(self, request: Request, body: Body) -> Any:
        route = request.query_params.get("route")
        timeout = float(request.query_params.get("timeout", "10"))
        return (await self.engine.faults.wait_held(route, timeout)).to_wire()

    def decide(self, request: Request, body: Body) -> Any:
        outcome = request.path_params["outcome"]
        if outcome not in ("release", "drop"):
            raise bad_request("outcome must be release or drop")
        try:
            return self.engine.faults.decide(int(request.path_params["held"]), outcome).to_wire()
        except KeyError:
            raise ApiError(404, "No such held request.") from None

    def seed(self, request: Request, body: Body) -> Any:
        ids = control.seed_chats(
            self.engine,
            int(body.get("count", 1)),
            labels=body.get("labels"),
            status=body.get("status", "waiting"),
            archived=bool(body.get("archived", False)),
            age_seconds=float(body.get("age_seconds", 0)),
        )
        return {"chat_ids": [str(i) for i in ids]}

    def records(self, request: Request, body: Body) -> Any:
        kind, records = request.path_params["kind"], self.engine.records
        if kind == "chats":
            return [control.chat_record(c) for c in self.engine.chats.values()]
        if kind == "request-counts":
            return dict(records.request_counts())
        if request.method == "DELETE":
            if kind != "requests":
                raise bad_request("only the request log can be cleared")
            records.clear_requests()
        tables = {
            "effects": records.effects,
            "interrupts": records.interrupts,
            "archives": records.archives,
            "tool-results": records.tool_results,
            "requests": records.requests,
        }
        return tables[kind]

    def chat_action(self, request: Request, body: Body) -> Any:
        chat: Chat = self.engine.chat(uuid.UUID(request.path_params["chat"]))
        action = request.path_params["action"]
        if action == "history-reset":
            control.reset_history(self.engine, chat)
        elif action == "revise":
            control.revise_message(self.engine, chat, int(body["message_id"]), str(body["text"]))
        elif action == "tool-timeout":
            self.engine.time_out_pending(chat)
        else:
            raise bad_request(f"unknown chat action {action!r}")
        return control.chat_record(chat)

    def workspaces(self, request: Request, body: Body) -> Any:
        engine = self.engine
        if request.method == "POST":
            engine.workspaces.add(uuid.uuid4())
        return {
            "workspaces": sorted(str(w) for w in engine.workspaces),
            "mcp_servers": sorted(str(m) for m in engine.mcp_servers),
        }


def admin_routes(engine: Engine, api: ChatApi) -> list[BaseRoute]:
    admin = AdminApi(engine, api)
    g = admin.guarded
    return [
        Route("/config", g(admin.config), methods=["GET", "PATCH"]),
        Route("/faults", g(admin.faults), methods=["GET", "DELETE"]),
        Route("/faults/{kind}", g(admin.arm), methods=["POST"]),
        Route("/held", g(admin.held), methods=["GET"]),
        Route("/held/wait", g(admin.wait_held), methods=["GET"]),
        Route("/held/{held}/{outcome}", g(admin.decide), methods=["POST"]),
        Route("/seed", g(admin.seed), methods=["POST"]),
        Route("/records/{kind}", g(admin.records), methods=["GET", "DELETE"]),
        Route("/chats/{chat}/{action}", g(admin.chat_action), methods=["POST"]),
        Route("/workspaces", g(admin.workspaces), methods=["GET", "POST"]),
        Route("/scripts", g(admin.scripts), methods=["GET", "POST", "DELETE"]),
    ]
