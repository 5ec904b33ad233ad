"""Every fault knob, in-process through ``sim.faults`` and over the admin HTTP routes.

All traffic goes over real loopback sockets with plain ``httpx`` and
``websockets``. The admin routes live under ``/simulator/v1`` and need the same
``Coder-Session-Token`` as the chat API.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosedError, InvalidStatus

from coder_chat.simulator import ROUTES, Simulator
from coder_chat.simulator.faults import UnknownRoute

from .wire import EXP, V2, Event, Wire, declare, kinds, turn_events

ADMIN = "/simulator/v1"
CUT_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError)


class Admin:
    """A plain httpx peer of the admin routes."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.http = httpx.AsyncClient(
            base_url=sim.base_url + ADMIN,
            headers={"Coder-Session-Token": sim.token},
            timeout=10,
        )

    async def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        response = await self.http.request(method, path, json=body, params=params or None)
        assert response.status_code == 200, (
            f"{method} {path}: {response.status_code} {response.text}"
        )
        return response.json()

    async def arm(self, kind: str, **body: Any) -> Any:
        return await self.call("POST", f"/faults/{kind}", body)

    async def faults(self) -> Any:
        return await self.call("GET", "/faults")

    async def records(self, kind: str) -> Any:
        return await self.call("GET", f"/records/{kind}")


@pytest.fixture
async def wire(sim: Simulator) -> AsyncIterator[Wire]:
    async with Wire(sim) as peer:
        yield peer


@pytest.fixture
async def admin(sim: Simulator) -> AsyncIterator[Admin]:
    peer = Admin(sim)
    try:
        yield peer
    finally:
        await peer.http.aclose()


# -- helpers -------------------------------------------------------------------


async def idle_chat(wire: Wire, text: str = "warm up") -> str:
    chat = await wire.create(text, **declare("lookup"))
    await wire.sim.wait_for_status(chat["id"], "waiting")
    return str(chat["id"])


def texts(sim: Simulator, chat_id: str) -> list[str]:
    return [m.text() for m in sim.messages(chat_id)]


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - plain records, no event to await
            await asyncio.sleep(0.005)


async def read_until_cut(wire: Wire, chat_id: str) -> tuple[list[Event], ConnectionClosedError]:
    """Read a stream until the server cuts it; return the events and the close error."""
    events: list[Event] = []
    url = wire.ws_url(f"{wire.prefix}/{chat_id}/stream")
    async with websockets.connect(url, additional_headers=wire.headers) as ws:
        with pytest.raises(ConnectionClosedError) as closed:
            async with asyncio.timeout(5):
                while True:
                    events.extend(json.loads(await ws.recv()))
    return events, closed.value


async def snapshot(wire: Wire, chat_id: str) -> list[Event]:
    """The first frame of a fresh stream (the whole connect snapshot), then a clean close."""
    async with wire.stream(chat_id) as reader:
        frame = await reader.frame()
    assert reader.ws.close_code == 1000
    return frame


def assert_abrupt(error: ConnectionClosedError) -> None:
    """The server went away without a close frame (a cut, not a goodbye)."""
    assert error.rcvd is None
    assert error.sent is None


# -- fail_next -----------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 503, 429, 408])
async def test_fail_next_in_process(sim: Simulator, wire: Wire, status: int) -> None:
    sim.faults.fail_next("create_chat", status, count=2)
    for _ in range(2):
        response = await wire.http.post(wire.prefix, json=wire.create_body("hello"))
        assert response.status_code == status
        assert response.json()["message"] == f"Simulated failure ({status})."
    assert sim.chats() == []  # a failure happens before any effect
    created = await wire.http.post(wire.prefix, json=wire.create_body("hello"))
    assert created.status_code == 201
    assert [str(c.id) for c in sim.chats()] == [created.json()["id"]]
    statuses = [r.status for r in sim.records.requests if r.route == "create_chat"]
    assert statuses == [status, status, 201]
    assert sim.faults.describe()["failures"] == []


@pytest.mark.parametrize("status", [500, 503, 429, 408])
async def test_fail_next_over_admin(sim: Simulator, wire: Wire, admin: Admin, status: int) -> None:
    chat_id = await idle_chat(wire)
    before = texts(sim, chat_id)
    armed = await admin.arm("fail", route="send_message", status=status, count=3)
    assert armed["failures"] == [{"remaining": 3, "route": "send_message", "status": status}]
    for _ in range(3):
        response = await wire.send(chat_id, "not yet")
        assert response.status_code == status
    assert texts(sim, chat_id) == before
    assert (await admin.faults())["failures"] == []
    sent = await wire.send(chat_id, "now")
    assert sent.status_code == 200
    assert sent.json()["message"]["content"] == [{"type": "text", "text": "now"}]


async def test_fail_next_only_hits_its_route(sim: Simulator, wire: Wire) -> None:
    chat_id = await idle_chat(wire)
    sim.faults.fail_next("get_messages", 503)
    assert (await wire.http.get(f"{wire.prefix}/{chat_id}")).status_code == 200
    assert (await wire.http.get(wire.prefix)).status_code == 200
    failed = await wire.http.get(f"{wire.prefix}/{chat_id}/messages")
    assert failed.status_code == 503
    assert (await wire.http.get(f"{wire.prefix}/{chat_id}/messages")).status_code == 200


_ROUTE_CALLS: dict[str, tuple[str, str]] = {
    "list_chats": ("GET", V2),
    "get_chat": ("GET", V2 + "/{chat}"),
    "update_chat": ("PATCH", V2 + "/{chat}"),
    "get_messages": ("GET", V2 + "/{chat}/messages"),
    "interrupt": ("POST", V2 + "/{chat}/interrupt"),
    "tool_results": ("POST", V2 + "/{chat}/tool-results"),
    "delete_queued": ("DELETE", V2 + "/{chat}/queue/1"),
    "promote_queued": ("POST", V2 + "/{chat}/queue/1/promote"),
    "get_file": ("GET", V2 + "/files/" + str(uuid.UUID(int=7))),
    "model_configs": ("GET", EXP + "/model-configs"),
}


async def test_fail_next_matches_each_http_route(sim: Simulator, wire: Wire, admin: Admin) -> None:
    chat_id = await idle_chat(wire)
    for route, (method, template) in sorted(_ROUTE_CALLS.items()):
        path = template.format(chat=chat_id)
        await admin.arm("fail", route=route, status=503)
        response = await wire.http.request(method, path, json={})
        assert response.status_code == 503, route
        assert [r.status for r in sim.records.requests if r.route == route] == [503], route
        again = await wire.http.request(method, path, json={})
        assert again.status_code != 503, route
    assert (await admin.faults())["failures"] == []


@pytest.mark.parametrize("via_admin", [False, True])
async def test_fail_next_on_websocket_upgrades(
    sim: Simulator, wire: Wire, admin: Admin, via_admin: bool
) -> None:
    chat_id = await idle_chat(wire)
    if via_admin:
        await admin.arm("fail", route="stream", status=503)
        await admin.arm("fail", route="watch", status=429)
    else:
        sim.faults.fail_next("stream", 503)
        sim.faults.fail_next("watch", 429)
    with pytest.raises(InvalidStatus) as stream_refused:
        await snapshot(wire, chat_id)
    assert stream_refused.value.response.status_code == 503
    watch_url = wire.ws_url(f"{wire.prefix}/watch")
    with pytest.raises(InvalidStatus) as watch_refused:
        async with websockets.connect(watch_url, additional_headers=wire.headers):
            pass
    assert watch_refused.value.response.status_code == 429
    # Then normal service.
    assert "status:waiting" in kinds(await snapshot(wire, chat_id))
    async with websockets.connect(watch_url, additional_headers=wire.headers) as ws:
        assert ws.protocol.state.name == "OPEN"


async def test_unknown_route_is_refused(sim: Simulator, admin: Admin) -> None:
    with pytest.raises(UnknownRoute, match="known: "):
        sim.faults.fail_next("no_such_route", 500)
    response = await admin.http.post("/faults/fail", json={"route": "nope", "status": 500})
    assert response.status_code == 400
    assert "unknown route 'nope'" in response.json()["message"]
    unknown_kind = await admin.http.post("/faults/explode", json={"route": "get_chat"})
    assert unknown_kind.status_code == 400
    assert "unknown fault kind" in unknown_kind.json()["message"]
    missing = await admin.http.post("/faults/fail", json={"route": "get_chat"})
    assert missing.status_code == 400
    assert (await admin.faults())["failures"] == []


async def test_every_route_name_can_be_armed_over_admin(admin: Admin) -> None:
    for route in sorted(ROUTES):
        armed = await admin.arm("fail", route=route, status=500, count=2)
        assert armed["failures"][-1] == {"remaining": 2, "route": route, "status": 500}
    assert [f["route"] for f in (await admin.faults())["failures"]] == sorted(ROUTES)


# -- hold ------------------------------------------------------------------------


async def test_create_held_after_commit_then_released(sim: Simulator, wire: Wire) -> None:
    sim.faults.hold("create_chat", "after")
    request = asyncio.create_task(wire.http.post(wire.prefix, json=wire.create_body("held")))
    held = await sim.faults.wait_held("create_chat")
    assert (held.route, held.method, held.phase, held.path) == ("create_chat", "POST", "after", V2)
    assert held.outcome is None
    # Committed on the server while the client still waits for its answer.
    assert not request.done()
    [chat] = sim.chats()
    assert texts(sim, str(chat.id))[0] == "held"
    assert sim.faults.held() == [held]
    released = sim.faults.decide(held.id, "release")
    assert released.outcome == "release"
    response = await request
    assert response.status_code == 201
    assert response.json()["id"] == str(chat.id)
    assert sim.faults.held() == []


async def test_create_held_after_commit_then_dropped(sim: Simulator, wire: Wire) -> None:
    """The crashed-in-flight window: the chat exists, the client never heard of it."""
    sim.faults.hold("create_chat", "after")
    request = asyncio.create_task(wire.http.post(wire.prefix, json=wire.create_body("orphan")))
    held = await sim.faults.wait_held("create_chat")
    sim.faults.decide(held.id, "drop")
    with pytest.raises(CUT_ERRORS):
        await request
    [chat] = sim.chats()
    assert texts(sim, str(chat.id))[0] == "orphan"
    assert [r.status for r in sim.records.requests if r.route == "create_chat"] == [0]
    # The connection pool recovers: the next call works.
    assert (await wire.http.get(f"{wire.prefix}/{chat.id}")).status_code == 200


async def test_create_held_over_admin_released(sim: Simulator, wire: Wire, admin: Admin) -> None:
    armed = await admin.arm("hold", route="create_chat", phase="after")
    assert armed["holds"][0]["route"] == "create_chat"
    assert armed["holds"][0]["action"] == "hold"
    request = asyncio.create_task(wire.http.post(wire.prefix, json=wire.create_body("held")))
    held = await admin.call("GET", "/held/wait", route="create_chat", timeout=5)
    assert held["route"] == "create_chat"
    assert held["phase"] == "after"
    assert held["method"] == "POST"
    assert held["chat_id"] is None
    assert held["outcome"] is None
    assert await admin.call("GET", "/held") == [held]
    chats = await admin.records("chats")
    assert len(chats) == 1
    assert not request.done()
    decided = await admin.call("POST", f"/held/{held['id']}/release")
    assert decided["outcome"] == "release"
    response = await request
    assert response.status_code == 201
    assert response.json()["id"] == chats[0]["id"]
    assert await admin.call("GET", "/held") == []


async def test_create_held_over_admin_dropped(sim: Simulator, wire: Wire, admin: Admin) -> None:
    await admin.arm("hold", route="create_chat")  # phase defaults to after
    request = asyncio.create_task(wire.http.post(wire.prefix, json=wire.create_body("orphan")))
    held = await admin.call("GET", "/held/wait", route="create_chat")
    decided = await admin.call("POST", f"/held/{held['id']}/drop")
    assert decided["outcome"] == "drop"
    with pytest.raises(CUT_ERRORS):
        await request
    [chat] = await admin.records("chats")
    user = next(m for m in chat["messages"] if m["role"] == "user")
    assert user["content"] == [{"type": "text", "text": "orphan"}]


async def test_hold_before_commit_has_no_effect_until_released(sim: Simulator, wire: Wire) -> None:
    sim.faults.hold("create_chat", "before")
    request = asyncio.create_task(wire.http.post(wire.prefix, json=wire.create_body("later")))
    held = await sim.faults.wait_held("create_chat")
    assert held.phase == "before"
    assert sim.chats() == []
    sim.faults.decide(held.id, "release")
    response = await request
    assert response.status_code == 201
    assert [str(c.id) for c in sim.chats()] == [response.json()["id"]]


async def test_hold_before_commit_dropped_over_admin_leaves_nothing(
    sim: Simulator, wire: Wire, admin: Admin
) -> None:
    chat_id = await idle_chat(wire)
    before = texts(sim, chat_id)
    await admin.arm("hold", route="send_message", phase="before", chat_id=chat_id)
    request = asyncio.create_task(wire.send(chat_id, "never lands"))
    held = await admin.call("GET", "/held/wait", route="send_message")
    assert held["chat_id"] == chat_id
    assert held["path"] == f"{V2}/{chat_id}/messages"
    await admin.call("POST", f"/held/{held['id']}/drop")
    with pytest.raises(CUT_ERRORS):
        await request
    assert texts(sim, chat_id) == before
    assert sim.chat(chat_id).status == "waiting"


async def test_hold_scoped_to_a_chat(sim: Simulator, wire: Wire, admin: Admin) -> None:
    target, other = await idle_chat(wire), await idle_chat(wire)
    await admin.arm("hold", route="send_message", phase="after", chat_id=target)
    passed = await wire.send(other, "not held")
    assert passed.status_code == 200
    request = asyncio.create_task(wire.send(target, "held"))
    held = await sim.faults.wait_held("send_message")
    assert str(held.chat_id) == target
    assert "held" in texts(sim, target)  # after-commit: already in history
    await admin.call("POST", f"/held/{held.id}/release")
    assert (await request).status_code == 200


async def test_held_send_lands_even_if_the_client_gave_up(sim: Simulator, wire: Wire) -> None:
    """Held before its commit, the client times out; released later, the send still lands."""
    chat_id = await idle_chat(wire)
    sim.faults.hold("send_message", "before")
    body = {"content": [{"type": "text", "text": "abandoned"}]}
    async with httpx.AsyncClient(base_url=sim.base_url, headers=wire.headers) as quitter:
        request = asyncio.create_task(
            quitter.post(f"{wire.prefix}/{chat_id}/messages", json=body, timeout=0.2)
        )
        held = await sim.faults.wait_held("send_message")
        with pytest.raises(httpx.TimeoutException):
            await request
    # The quitter's socket is closed; a round trip on another one lets the server see it.
    assert (await wire.http.get(f"{wire.prefix}/{chat_id}")).status_code == 200
    assert "abandoned" not in texts(sim, chat_id)
    sim.faults.decide(held.id, "release")
    await wait_until(lambda: "abandoned" in texts(sim, chat_id))
    await sim.wait_for_status(chat_id, "waiting")


async def test_held_wait_times_out_and_bad_decisions(admin: Admin) -> None:
    waited = await admin.http.get("/held/wait", params={"route": "create_chat", "timeout": "0.05"})
    assert waited.status_code == 408
    assert waited.json()["message"] == "Nothing was held in time."
    unknown = await admin.http.post("/held/999/release")
    assert unknown.status_code == 404
    bad = await admin.http.post("/held/1/maybe")
    assert bad.status_code == 400
    with pytest.raises(TimeoutError):
        await admin.sim.faults.wait_held("create_chat", timeout=0.05)


@pytest.mark.parametrize("via_admin", [False, True])
async def test_clear_releases_held_requests_and_removes_rules(
    sim: Simulator, wire: Wire, admin: Admin, via_admin: bool
) -> None:
    sim.faults.hold("create_chat", "after")
    sim.faults.fail_next("list_chats", 500, count=5)
    sim.faults.drop_streams(1, times=None)
    sim.faults.withhold_action_required(times=None)
    sim.faults.retry_generation(times=3)
    request = asyncio.create_task(wire.http.post(wire.prefix, json=wire.create_body("x")))
    await sim.faults.wait_held("create_chat")
    if via_admin:
        described = await admin.call("DELETE", "/faults")
    else:
        sim.faults.clear()
        described = sim.faults.describe()
    assert described == {
        "failures": [],
        "holds": [],
        "stream_drops": [],
        "withhold_action_required": [],
        "retry_generation": [],
        "held": [],
    }
    assert (await request).status_code == 201
    assert (await wire.http.get(wire.prefix)).status_code == 200


# -- cut -------------------------------------------------------------------------


async def test_cut_after_commit_in_process(sim: Simulator, wire: Wire) -> None:
    sim.faults.cut_after_commit("create_chat", count=2)
    for text in ("one", "two"):
        with pytest.raises(CUT_ERRORS):
            await wire.http.post(wire.prefix, json=wire.create_body(text))
    assert sorted(texts(sim, str(c.id))[0] for c in sim.chats()) == ["one", "two"]
    assert (await wire.http.post(wire.prefix, json=wire.create_body("three"))).status_code == 201
    assert len(sim.chats()) == 3


async def test_cut_before_commit_in_process(sim: Simulator, wire: Wire) -> None:
    sim.faults.cut_before_commit("create_chat")
    with pytest.raises(CUT_ERRORS):
        await wire.http.post(wire.prefix, json=wire.create_body("nothing"))
    assert sim.chats() == []
    assert sim.records.request_counts()["create_chat"] == 1
    assert (await wire.http.post(wire.prefix, json=wire.create_body("fine"))).status_code == 201


async def test_cut_after_commit_over_admin(sim: Simulator, wire: Wire, admin: Admin) -> None:
    chat_id = await idle_chat(wire)
    armed = await admin.arm("cut", route="send_message")
    assert armed["holds"][0]["phase"] == "after"
    assert armed["holds"][0]["action"] == "drop"
    with pytest.raises(CUT_ERRORS):
        await wire.send(chat_id, "committed anyway")
    assert "committed anyway" in texts(sim, chat_id)
    await sim.wait_for_status(chat_id, "waiting")


async def test_cut_before_commit_over_admin(sim: Simulator, wire: Wire, admin: Admin) -> None:
    chat_id = await idle_chat(wire)
    before = texts(sim, chat_id)
    armed = await admin.arm("cut", route="send_message", phase="before", count=2)
    assert armed["holds"][0] == {
        "remaining": 2,
        "route": "send_message",
        "phase": "before",
        "chat_id": None,
        "action": "drop",
        "delay": 0.0,
    }
    for _ in range(2):
        with pytest.raises(CUT_ERRORS):
            await wire.send(chat_id, "lost")
    assert texts(sim, chat_id) == before
    assert (await wire.send(chat_id, "kept")).status_code == 200
    assert "lost" not in texts(sim, chat_id)


# -- delay -----------------------------------------------------------------------


async def _late_send(sim: Simulator, wire: Wire, chat_id: str) -> None:
    body = {"content": [{"type": "text", "text": "late"}]}
    with pytest.raises(httpx.TimeoutException):
        await wire.http.post(f"{wire.prefix}/{chat_id}/messages", json=body, timeout=0.05)
    gave_up = datetime.now(UTC)
    await wait_until(lambda: "late" in texts(sim, chat_id))
    late = next(m for m in sim.messages(chat_id) if m.text() == "late")
    assert late.created_at > gave_up  # it landed after the client had given up
    await sim.wait_for_status(chat_id, "waiting")
    assert texts(sim, chat_id)[-1] == 'You said: "late"'
    assert [r.status for r in sim.records.requests if r.route == "send_message"] == [200]


async def test_delay_commit_in_process(sim: Simulator, wire: Wire) -> None:
    chat_id = await idle_chat(wire)
    sim.faults.delay_commit("send_message", 0.5)
    assert sim.faults.describe()["holds"][0]["action"] == "delay"
    await _late_send(sim, wire, chat_id)


async def test_delay_commit_over_admin(sim: Simulator, wire: Wire, admin: Admin) -> None:
    chat_id = await idle_chat(wire)
    armed = await admin.arm("delay", route="send_message", seconds=0.5)
    assert armed["holds"][0]["delay"] == 0.5
    assert armed["holds"][0]["phase"] == "before"
    await _late_send(sim, wire, chat_id)
    # Spent: the next send is immediate.
    assert (await wire.send(chat_id, "prompt")).status_code == 200


# -- stream drops ----------------------------------------------------------------


async def test_stream_drop_once_in_process(sim: Simulator, wire: Wire) -> None:
    chat_id = await idle_chat(wire)
    sim.faults.drop_streams(after_events=2)
    events, error = await read_until_cut(wire, chat_id)
    assert_abrupt(error)
    assert kinds(events) == ["message:user", "message:assistant"]
    # Only once: the next socket gets the whole snapshot and closes cleanly.
    assert kinds(await snapshot(wire, chat_id)) == [
        "message:user",
        "message:assistant",
        "status:waiting",
        "preview_reset",
    ]
    statuses = [r.status for r in sim.records.requests if r.route == "stream"]
    assert statuses == [101, 101]


async def test_stream_drop_every_time_over_admin(sim: Simulator, wire: Wire, admin: Admin) -> None:
    chat_id = await idle_chat(wire)
    armed = await admin.arm("stream-drop", after_events=3, times=None)
    assert armed["stream_drops"] == [{"remaining": None, "after_events": 3, "chat_id": None}]
    for _ in range(3):
        events, error = await read_until_cut(wire, chat_id)
        assert_abrupt(error)
        assert len(events) == 3
    assert (await admin.faults())["stream_drops"] == armed["stream_drops"]
    await admin.call("DELETE", "/faults")
    assert "preview_reset" in kinds(await snapshot(wire, chat_id))


async def test_stream_drop_zero_events_and_chat_scope(
    sim: Simulator, wire: Wire, admin: Admin
) -> None:
    target, other = await idle_chat(wire), await idle_chat(wire)
    await admin.arm("stream-drop", after_events=0, times=2, chat_id=target)
    assert len(await snapshot(wire, other)) == 4  # other chats are untouched
    for _ in range(2):
        events, error = await read_until_cut(wire, target)
        assert events == []
        assert_abrupt(error)
    assert len(await snapshot(wire, target)) == 4


async def test_stream_drop_mid_turn_then_reconnect(sim: Simulator, wire: Wire) -> None:
    chat_id = await idle_chat(wire)
    sim.faults.drop_streams(after_events=6)  # the 4-event snapshot, then 2 live events
    url = wire.ws_url(f"{wire.prefix}/{chat_id}/stream")
    events: list[Event] = []
    async with websockets.connect(url, additional_headers=wire.headers) as ws:
        events.extend(json.loads(await ws.recv()))
        assert len(events) == 4
        assert (await wire.send(chat_id, "/deltas 5 go on")).status_code == 200
        with pytest.raises(ConnectionClosedError) as closed:
            async with asyncio.timeout(5):
                while True:
                    events.extend(json.loads(await ws.recv()))
    assert_abrupt(closed.value)
    assert kinds(events[4:]) == ["message:user", "status:running"]
    await sim.wait_for_status(chat_id, "waiting")
    replay = kinds(await snapshot(wire, chat_id))
    assert replay.count("message:assistant") == 2
    assert replay[-2:] == ["status:waiting", "preview_reset"]


# -- withheld action_required ---------------------------------------------------------


async def test_withheld_action_required_is_redelivered_after_reconnect(
    sim: Simulator, wire: Wire
) -> None:
    chat_id = await idle_chat(wire)
    sim.faults.withhold_action_required()
    async with wire.stream(chat_id) as first:
        await first.until_status("waiting")
        assert (await wire.send(chat_id, '/tool lookup {"q": 1}')).status_code == 200
        await first.until_status("requires_action")
        assert "action_required" not in kinds(first.events)
        # A reconnecting socket is told about the pending call.
        reconnect = await snapshot(wire, chat_id)
        action = next(e for e in reconnect if e["type"] == "action_required")
        [call] = action["action_required"]["tool_calls"]
        assert call["tool_name"] == "lookup"
        assert json.loads(call["args"]) == {"q": 1}
        assert call["tool_call_id"] == sim.chat(chat_id).pending_calls[0].tool_call_id
        results = {"results": [{"tool_call_id": call["tool_call_id"], "output": "found"}]}
        submitted = await wire.http.post(f"{wire.prefix}/{chat_id}/tool-results", json=results)
        assert submitted.status_code == 204
        await first.until_status("waiting")
    # The first socket never saw it, through the whole pause.
    assert "action_required" not in kinds(first.events)
    assert "status:requires_action" in kinds(first.events)


async def test_withhold_action_over_admin_counts_and_scope(
    sim: Simulator, wire: Wire, admin: Admin
) -> None:
    target = (await wire.create("/tool first", **declare("first")))["id"]
    other = (await wire.create("/tool second", **declare("second")))["id"]
    await sim.wait_for_status(target, "requires_action")
    await sim.wait_for_status(other, "requires_action")
    armed = await admin.arm("withhold-action", times=2, chat_id=target)
    assert armed["withhold_action_required"] == [{"remaining": 2, "chat_id": target}]
    assert "action_required" in kinds(await snapshot(wire, other))
    for _ in range(2):
        frame = await snapshot(wire, target)
        assert "status:requires_action" in kinds(frame)
        assert "action_required" not in kinds(frame)
    assert "action_required" in kinds(await snapshot(wire, target))
    assert (await admin.faults())["withhold_action_required"] == []


# -- retried generations -------------------------------------------------------------


def _parts(events: list[Event]) -> list[dict[str, Any]]:
    return [e["message_part"] for e in events if e["type"] == "message_part"]


async def test_retry_generation_in_process(sim: Simulator, wire: Wire) -> None:
    chat_id = await idle_chat(wire)
    sim.faults.retry_generation()
    async with wire.stream(chat_id) as reader:
        await reader.until_status("waiting")
        assert (await wire.send(chat_id, "/deltas 4 try twice")).status_code == 200
        events = await turn_events(reader, "waiting")
    trace = kinds(events)
    assert trace.count("retry") == 1
    retry_at = trace.index("retry")
    assert events[retry_at]["retry"]["attempt"] == 1
    assert trace[retry_at + 1] == "preview_reset"
    first, second = _parts(events[:retry_at]), _parts(events[retry_at:])
    assert [p["seq"] for p in first] == [1, 2]  # cut half way
    assert [p["seq"] for p in second] == [1, 2, 3, 4]  # the retry streams from seq 1
    attempt = first[0]["generation_attempt"]
    assert {p["generation_attempt"] for p in second} == {attempt + 1}
    final = [e["message"] for e in events if e["type"] == "message"][-1]
    assert final["content"][0]["text"] == "".join(p["part"]["text"] for p in second)
    assert final["content"][0]["text"] == 'You said: "try twice"'


async def test_retry_generation_over_admin(sim: Simulator, wire: Wire, admin: Admin) -> None:
    target, other = await idle_chat(wire), await idle_chat(wire)
    armed = await admin.arm("retry-generation", times=2, chat_id=target)
    assert armed["retry_generation"] == [{"remaining": 2, "chat_id": target}]
    async with wire.stream(other) as reader:
        await reader.until_status("waiting")
        assert (await wire.send(other, "no retry here")).status_code == 200
        assert "retry" not in kinds(await turn_events(reader, "waiting"))
    async with wire.stream(target) as reader:
        await reader.until_status("waiting")
        assert (await wire.send(target, "/deltas 2 retry me")).status_code == 200
        events = await turn_events(reader, "waiting")
    retries = [e["retry"] for e in events if e["type"] == "retry"]
    assert [r["attempt"] for r in retries] == [1, 2]
    assert all(r["kind"] == "overloaded" for r in retries)
    assert texts(sim, target)[-1] == 'You said: "retry me"'
    assert (await admin.faults())["retry_generation"] == []


# -- configuration: slow interrupt settling, era-B toggles -------------------------------


async def _slow_interrupt_settling(
    sim: Simulator, wire: Wire, set_winddown: Callable[[float], Awaitable[None]]
) -> None:
    fast = (await wire.create("work /sleep 60"))["id"]
    slow = (await wire.create("work /sleep 60"))["id"]
    # With no wind-down, an interrupted run settles at once.
    await set_winddown(0.0)
    interrupted = await wire.http.post(f"{wire.prefix}/{fast}/interrupt")
    assert interrupted.status_code == 200
    assert interrupted.json()["status"] == "interrupting"
    await sim.wait_for_status(fast, "waiting")
    # Slowed down (the run reads the setting when its wind-down starts, after this).
    await set_winddown(0.5)
    interrupted = await wire.http.post(f"{wire.prefix}/{slow}/interrupt")
    assert interrupted.status_code == 200
    assert interrupted.json()["status"] == "interrupting"
    # A whole other turn starts and finishes while the slow one is still winding down.
    quick = (await wire.create("quick"))["id"]
    await sim.wait_for_status(quick, "waiting")
    assert (await wire.http.get(f"{wire.prefix}/{slow}")).json()["status"] == "interrupting"
    again = await wire.http.post(f"{wire.prefix}/{slow}/interrupt")
    assert again.status_code == 409
    archive = await wire.http.patch(f"{wire.prefix}/{slow}", json={"archived": True})
    assert archive.status_code == 409
    await sim.wait_for_status(slow, "waiting")
    archived = await wire.http.patch(f"{wire.prefix}/{slow}", json={"archived": True})
    assert archived.status_code == 204


async def test_slow_interrupt_winddown_in_process(sim: Simulator, wire: Wire) -> None:
    async def set_winddown(seconds: float) -> None:
        sim.config.interrupt_winddown = seconds

    await _slow_interrupt_settling(sim, wire, set_winddown)


async def test_slow_interrupt_winddown_over_admin(sim: Simulator, wire: Wire, admin: Admin) -> None:
    async def set_winddown(seconds: float) -> None:
        config = await admin.call("PATCH", "/config", {"interrupt_winddown": seconds})
        assert config["interrupt_winddown"] == seconds

    await _slow_interrupt_settling(sim, wire, set_winddown)
    assert sim.config.interrupt_winddown == 0.5


async def test_era_b_experimental_routes_only(sim: Simulator, wire: Wire, admin: Admin) -> None:
    config = await admin.call("PATCH", "/config", {"era_b": {"experimental_routes_only": True}})
    assert config["era_b"]["experimental_routes_only"] is True
    assert sim.config.era_b.experimental_routes_only is True
    assert (await wire.http.get(V2)).status_code == 404
    assert (await wire.http.get(EXP)).status_code == 200
    await admin.call("PATCH", "/config", {"era_b": {"experimental_routes_only": False}})
    assert (await wire.http.get(V2)).status_code == 200


async def test_era_b_interrupt_always_ok(sim: Simulator, wire: Wire, admin: Admin) -> None:
    chat_id = await idle_chat(wire)
    assert (await wire.http.post(f"{wire.prefix}/{chat_id}/interrupt")).status_code == 409
    await admin.call("PATCH", "/config", {"era_b": {"interrupt_always_ok": True}})
    response = await wire.http.post(f"{wire.prefix}/{chat_id}/interrupt")
    assert response.status_code == 200
    assert response.json()["status"] == "waiting"
    assert [r.http_status for r in sim.records.interrupts] == [409, 200]


async def test_era_b_pending_status(sim: Simulator, wire: Wire, admin: Admin) -> None:
    await admin.call("PATCH", "/config", {"era_b": {"pending_status": True}})
    chat = await wire.create("hello")
    assert chat["status"] == "pending"
    await sim.wait_for_status(chat["id"], "waiting")


async def test_config_route_rejects_bad_keys_and_hides_the_token(
    sim: Simulator, admin: Admin
) -> None:
    config = await admin.call("GET", "/config")
    assert "token" not in config
    assert config["organization_id"] == str(sim.organization_id)
    assert set(config["era_b"]) >= {"pending_status", "interrupt_always_ok"}
    raw = await admin.http.get("/config")
    assert sim.token not in raw.text
    for body in (
        {"token": "stolen"},
        {"organization_id": str(uuid.uuid4())},
        {"no_such_setting": 1},
        {"era_b": {"no_such_toggle": True}},
    ):
        response = await admin.http.patch("/config", json=body)
        assert response.status_code == 400, body
    assert (await admin.call("GET", "/config")) == config


# -- seeding and listing ----------------------------------------------------------------


async def _list_all(wire: Wire, params: dict[str, Any], page: int) -> list[dict[str, Any]]:
    """Every chat matching ``params``, walking ``after_id`` cursor pages of ``page``."""
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        query: dict[str, Any] = {**params, "limit": page}
        if cursor:
            query["after_id"] = cursor
        response = await wire.http.get(wire.prefix, params=query)
        assert response.status_code == 200, response.text
        batch: list[dict[str, Any]] = response.json()
        assert len(batch) <= page
        out.extend(batch)
        if len(batch) < page:
            return out
        cursor = batch[-1]["id"]


async def test_seed_thousands_over_admin_and_list_by_label(
    sim: Simulator, wire: Wire, admin: Admin
) -> None:
    seeded = await admin.call("POST", "/seed", {"count": 3000, "labels": {"wf": "big", "n": "1"}})
    ids = seeded["chat_ids"]
    assert len(ids) == len(set(ids)) == 3000
    decoys = await admin.call("POST", "/seed", {"count": 25, "labels": {"wf": "other"}})
    assert len(decoys["chat_ids"]) == 25
    listed = await _list_all(wire, {"label": "wf:big"}, page=500)
    assert len(listed) == 3000
    assert {c["id"] for c in listed} == set(ids)
    assert all(c["labels"] == {"wf": "big", "n": "1"} for c in listed)
    # Labels are ANDed.
    both = await wire.http.get(wire.prefix, params=[("label", "wf:big"), ("label", "n:1")])
    assert len(both.json()) == 3000
    none = await wire.http.get(wire.prefix, params=[("label", "wf:big"), ("label", "n:2")])
    assert none.json() == []
    # Offset paging walks the same order as the cursor.
    page = await wire.http.get(
        wire.prefix, params={"label": "wf:big", "limit": 1000, "offset": 1000}
    )
    assert [c["id"] for c in page.json()] == [c["id"] for c in listed[1000:2000]]
    other = await _list_all(wire, {"label": "wf:other"}, page=10)
    assert {c["id"] for c in other} == set(decoys["chat_ids"])
    assert len(await admin.records("chats")) == 3025


async def test_seed_in_process_options(sim: Simulator, wire: Wire) -> None:
    archived = sim.seed(3, labels={"wf": "old"}, archived=True, age_seconds=3600)
    stuck = sim.seed(2, labels={"wf": "stuck"}, status="running")
    paused = sim.seed(1, labels={"wf": "paused"}, status="requires_action")
    failed = sim.seed(1, status="error")
    assert (await wire.http.get(wire.prefix, params={"label": "wf:old"})).json() == []
    shown = await wire.http.get(wire.prefix, params={"label": "wf:old", "q": "archived:true"})
    assert {c["id"] for c in shown.json()} == {str(i) for i in archived}
    assert all(sim.chat(i).created_at < sim.chat(stuck[0]).created_at for i in archived)
    assert {sim.chat(i).status for i in stuck} == {"running"}
    assert sim.chat(paused[0]).pending_calls[0].tool_name == "seeded_tool"
    assert sim.chat(failed[0]).last_error is not None
    # A seeded stuck turn has no run behind it, yet interrupting settles it.
    response = await wire.http.post(f"{wire.prefix}/{stuck[0]}/interrupt")
    assert response.status_code == 200
    await sim.wait_for_status(stuck[0], "waiting")


async def test_seed_over_admin_validates(admin: Admin) -> None:
    bad_status = await admin.http.post("/seed", json={"count": 1, "status": "interrupting"})
    assert bad_status.status_code == 400
    busy_archived = await admin.http.post(
        "/seed", json={"count": 1, "status": "running", "archived": True}
    )
    assert busy_archived.status_code == 400
    assert await admin.records("chats") == []
    seeded = await admin.call("POST", "/seed", {"count": 2, "status": "requires_action"})
    records = await admin.records("chats")
    assert {r["id"] for r in records} == set(seeded["chat_ids"])
    assert all(r["status"] == "requires_action" for r in records)
    assert all(len(r["pending_calls"]) == 1 for r in records)


# -- records ------------------------------------------------------------------------------


async def test_records_over_admin(sim: Simulator, wire: Wire, admin: Admin) -> None:
    effect_chat = (await wire.create('/server-tool ping {"a": 1}'))["id"]
    tool_chat = (await wire.create("/tool lookup", **declare("lookup")))["id"]
    await sim.wait_for_status(effect_chat, "waiting")
    await sim.wait_for_status(tool_chat, "requires_action")
    call_id = sim.chat(tool_chat).pending_calls[0].tool_call_id
    results = {"results": [{"tool_call_id": call_id, "output": {"v": 2}, "is_error": False}]}
    submitted = await wire.http.post(f"{wire.prefix}/{tool_chat}/tool-results", json=results)
    assert submitted.status_code == 204
    await sim.wait_for_status(tool_chat, "waiting")
    assert (await wire.http.post(f"{wire.prefix}/{tool_chat}/interrupt")).status_code == 409
    archive = await wire.http.patch(f"{wire.prefix}/{tool_chat}", json={"archived": True})
    assert archive.status_code == 204

    [effect] = await admin.records("effects")
    assert effect["chat_id"] == effect_chat
    assert effect["tool_name"] == "ping"
    assert effect["args"] == {"a": 1}
    assert effect["tool_call_id"] == sim.records.effects[0].tool_call_id
    datetime.fromisoformat(effect["at"])

    [result] = await admin.records("tool-results")
    assert {k: result[k] for k in ("chat_id", "tool_call_id", "tool_name", "output")} == {
        "chat_id": tool_chat,
        "tool_call_id": call_id,
        "tool_name": "lookup",
        "output": {"v": 2},
    }
    assert result["is_error"] is False
    assert result["synthetic"] is False

    [interrupt] = await admin.records("interrupts")
    assert (interrupt["chat_id"], interrupt["status_before"], interrupt["http_status"]) == (
        tool_chat,
        "waiting",
        409,
    )
    [archived] = await admin.records("archives")
    assert (archived["chat_id"], archived["archived"]) == (tool_chat, True)

    chats = {c["id"]: c for c in await admin.records("chats")}
    assert set(chats) == {effect_chat, tool_chat}
    assert chats[tool_chat]["archived"] is True
    hidden = [m for m in chats[effect_chat]["messages"] if not m["visible"]]
    assert [m["role"] for m in hidden] == ["system"]  # model-only rows are there too

    requests = await admin.records("requests")
    assert {"method", "route", "path", "status", "at"} <= set(requests[0])
    assert ("POST", "create_chat", V2, 201) in {
        (r["method"], r["route"], r["path"], r["status"]) for r in requests
    }
    counts = await admin.records("request-counts")
    assert counts == {"create_chat": 2, "tool_results": 1, "interrupt": 1, "update_chat": 1}
    assert await admin.call("DELETE", "/records/requests") == []
    assert await admin.records("request-counts") == {}
    assert (await admin.http.get("/records/nonsense")).status_code == 400


# -- admin auth and isolation ------------------------------------------------------------------

_ADMIN_CALLS = [
    ("GET", "/config"),
    ("PATCH", "/config"),
    ("GET", "/faults"),
    ("DELETE", "/faults"),
    ("POST", "/faults/fail"),
    ("POST", "/faults/hold"),
    ("POST", "/faults/cut"),
    ("POST", "/faults/delay"),
    ("POST", "/faults/stream-drop"),
    ("POST", "/faults/withhold-action"),
    ("POST", "/faults/retry-generation"),
    ("GET", "/held"),
    ("GET", "/held/wait"),
    ("POST", "/held/1/release"),
    ("POST", "/held/1/drop"),
    ("POST", "/seed"),
    ("GET", "/records/chats"),
    ("GET", "/records/effects"),
    ("GET", "/records/interrupts"),
    ("GET", "/records/archives"),
    ("GET", "/records/tool-results"),
    ("GET", "/records/requests"),
    ("GET", "/records/request-counts"),
    ("DELETE", "/records/requests"),
]


async def test_admin_routes_need_the_token(sim: Simulator) -> None:
    body = {"route": "create_chat", "status": 500, "count": 10, "after_events": 0, "seconds": 1}
    wrong_token = {"Coder-Session-Token": sim.token + "x"}
    async with httpx.AsyncClient(base_url=sim.base_url + ADMIN) as http:
        for method, path in _ADMIN_CALLS:
            missing = await http.request(method, path, json=body)
            assert missing.status_code == 401, (method, path)
            assert missing.json()["message"] == "Authentication required."
            wrong = await http.request(method, path, json=body, headers=wrong_token)
            assert wrong.status_code == 401, (method, path)
            assert wrong.json()["message"] == "Invalid session token."
            assert sim.token not in missing.text + wrong.text
    # Nothing was armed or seeded by the refused calls.
    assert sim.faults.describe()["failures"] == []
    assert sim.faults.describe()["holds"] == []
    assert sim.faults.describe()["stream_drops"] == []
    assert sim.chats() == []


async def test_chat_api_paths_never_reach_the_admin_routes(
    sim: Simulator, wire: Wire, admin: Admin
) -> None:
    await admin.arm("fail", route="get_chat", status=500, count=5)
    described = await admin.faults()
    for prefix in (V2, EXP, "/api/v2", "/api/experimental", "/api"):
        for suffix in ("/simulator/v1/faults", "/simulator/v1/held", "/simulator/v1/config"):
            for method in ("GET", "DELETE", "PATCH"):
                response = await wire.http.request(method, prefix + suffix, json={})
                assert response.status_code in (400, 404, 405), (method, prefix + suffix)
                assert "failures" not in response.text
    assert await admin.faults() == described  # no DELETE got through to the plan
    assert sim.config.era_b.experimental_routes_only is False
    # Admin calls are not chat API traffic and leave no request records.
    await admin.call("GET", "/held")
    assert all(not r.path.startswith(ADMIN) for r in sim.records.requests)
