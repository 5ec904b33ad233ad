"""The per-user ``/watch`` WebSocket (wire reference 6): one JSON object per frame."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from coder_chat.simulator import Simulator

from .streams import ASK, WatchEvent, settled_chat, watching
from .wire import EXP, Wire


def status_is(chat_id: str, kind: str, status: str) -> Callable[[WatchEvent], bool]:
    return lambda e: (
        e["chat"]["id"] == chat_id
        and (e["kind"], e["chat"]["status"])
        == (
            kind,
            status,
        )
    )


async def test_create_and_turn_publish_created_then_status_change(sim: Simulator) -> None:
    async with Wire(sim) as wire, watching(wire) as watch:
        chat = await wire.create("hello watchers")
        await watch.until(status_is(chat["id"], "status_change", "waiting"))
    assert watch.trace(chat["id"]) == [("created", "running"), ("status_change", "waiting")]
    created = watch.events[0]
    assert set(created) == {"kind", "chat"}
    assert created["chat"]["title"] == chat["title"]
    assert created["chat"]["organization_id"] == str(sim.organization_id)
    assert "files" not in created["chat"]  # the embedded chat is the light shape


async def test_every_send_publishes_status_change(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, _ = await settled_chat(sim, wire)
        async with watching(wire) as watch:
            response = await wire.send(chat_id, "again")
            assert response.json()["queued"] is False
            await watch.until(status_is(chat_id, "status_change", "waiting"))
    assert watch.trace(chat_id) == [("status_change", "running"), ("status_change", "waiting")]


async def test_failed_turn_publishes_status_change_error(sim: Simulator) -> None:
    async with Wire(sim) as wire, watching(wire) as watch:
        chat = await wire.create("/fail fatal")
        event = await watch.until(status_is(chat["id"], "status_change", "error"))
    assert event["chat"]["last_error"]["kind"] == "config"
    assert watch.trace(chat["id"]) == [("created", "running"), ("status_change", "error")]


async def test_title_change(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, _ = await settled_chat(sim, wire)
        async with watching(wire) as watch:
            response = await wire.http.patch(f"{wire.prefix}/{chat_id}", json={"title": "Renamed"})
            assert response.status_code == 204, response.text
            event = await watch.next()
    assert event["kind"] == "title_change"
    assert event["chat"]["id"] == chat_id
    assert event["chat"]["title"] == "Renamed"


async def test_archive_is_deleted_and_unarchive_is_created(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, _ = await settled_chat(sim, wire)
        async with watching(wire) as watch:
            url = f"{wire.prefix}/{chat_id}"
            assert (await wire.http.patch(url, json={"archived": True})).status_code == 204
            archived = await watch.next()
            assert (await wire.http.patch(url, json={"archived": False})).status_code == 204
            restored = await watch.next()
    assert (archived["kind"], archived["chat"]["id"], archived["chat"]["archived"]) == (
        "deleted",
        chat_id,
        True,
    )
    assert (restored["kind"], restored["chat"]["id"], restored["chat"]["archived"]) == (
        "created",
        chat_id,
        False,
    )


async def test_action_required_carries_tool_calls(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, _ = await settled_chat(sim, wire, unsafe_dynamic_tools=[ASK])
        async with watching(wire) as watch:
            await wire.send(chat_id, '/tool ask_user {"question": "ok?"} confirm')
            action = await watch.until(lambda e: e["kind"] == "action_required")
            (call,) = action["tool_calls"]
            posted = await wire.http.post(
                f"{wire.prefix}/{chat_id}/tool-results",
                json={"results": [{"tool_call_id": call["tool_call_id"], "output": "yes"}]},
            )
            assert posted.status_code == 204
            await watch.until(status_is(chat_id, "status_change", "waiting"))
    assert action["chat"]["id"] == chat_id
    assert action["chat"]["status"] == "requires_action"
    assert call["tool_name"] == "ask_user"
    assert json.loads(call["args"]) == {"question": "ok?"}
    committed_calls = [
        p["tool_call_id"]
        for m in sim.messages(chat_id)
        for p in m.content
        if p["type"] == "tool-call"
    ]
    assert committed_calls == [call["tool_call_id"]]
    assert watch.trace(chat_id) == [
        ("status_change", "running"),
        ("action_required", "requires_action"),
        ("status_change", "running"),
        ("status_change", "waiting"),
    ]


async def test_interrupt_publishes_status_changes(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, _ = await settled_chat(sim, wire)
        await wire.send(chat_id, "/sleep 2 long")
        async with watching(wire) as watch:
            response = await wire.http.post(f"{wire.prefix}/{chat_id}/interrupt")
            assert response.status_code == 200
            await watch.until(status_is(chat_id, "status_change", "waiting"))
    assert watch.trace(chat_id) == [
        ("status_change", "interrupting"),
        ("status_change", "waiting"),
    ]


async def test_no_replay_on_connect(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        # Created, ran and settled while nobody watched: those events are gone.
        chat_id, _ = await settled_chat(sim, wire)
        async with watching(wire) as watch:
            await wire.http.patch(f"{wire.prefix}/{chat_id}", json={"title": "After connect"})
            first = await watch.next()
    assert first["kind"] == "title_change"
    assert first["chat"]["title"] == "After connect"


async def test_one_socket_hears_every_chat_of_the_user(sim: Simulator) -> None:
    async with Wire(sim) as wire, watching(wire) as watch:
        one = await wire.create("first chat")
        two = await wire.create("second chat")
        for chat in (one, two):
            await sim.wait_for_status(chat["id"], "waiting")
        seen: set[tuple[str, str]] = set()
        while len(seen) < 4:
            event = await watch.next()
            seen.add((event["chat"]["id"], event["kind"]))
    assert seen == {
        (one["id"], "created"),
        (one["id"], "status_change"),
        (two["id"], "created"),
        (two["id"], "status_change"),
    }


async def test_watch_on_experimental_prefix(sim: Simulator) -> None:
    async with Wire(sim, prefix=EXP) as wire, watching(wire) as watch:
        chat = await wire.create("via experimental")
        event = await watch.next()
    assert (event["kind"], event["chat"]["id"]) == ("created", chat["id"])


@pytest.mark.parametrize(
    ("headers", "message"),
    [({}, "Authentication required."), ({"Coder-Session-Token": "nope"}, "Invalid session token.")],
)
async def test_watch_upgrade_needs_a_valid_token(
    sim: Simulator, headers: dict[str, str], message: str
) -> None:
    async with Wire(sim) as wire:
        url = wire.ws_url(f"{wire.prefix}/watch")
        with pytest.raises(InvalidStatus) as caught:
            async with websockets.connect(url, additional_headers=headers):
                pass
    assert caught.value.response.status_code == 401
    assert json.loads(caught.value.response.body or b"{}")["message"] == message


async def test_client_data_frame_closes_watch(sim: Simulator) -> None:
    async with Wire(sim) as wire, watching(wire) as watch:
        await watch.ws.send("hello?")
        with pytest.raises(ConnectionClosed) as caught:
            await watch.next()
    assert caught.value.rcvd is not None
    assert caught.value.rcvd.code == 1008
