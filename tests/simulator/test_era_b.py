"""Era-B toggles (``SimulatorConfig.era_b``): each one brings back one pre-state-machine behaviour.

Every test first shows (or relies on) the era-C default, then flips exactly one
toggle on the running simulator and shows the old behaviour over real sockets.
"""

from __future__ import annotations

import json

import pytest
import websockets
from websockets.exceptions import InvalidStatus

from coder_chat.simulator import Simulator

from .streams import committed, of_type, settled_chat, since, told, watching
from .wire import EXP, V2, Wire, kinds


async def test_pending_status_before_running(sim: Simulator) -> None:
    sim.config.era_b.pending_status = True
    async with Wire(sim) as wire:
        chat = await wire.create("hello from era b")
        assert chat["status"] == "pending"
        await sim.wait_for_status(chat["id"], "waiting")
        last = sim.messages(chat["id"])[-1].id
        again = await told(wire, chat["id"], last, "/deltas 2 again")
    assert again.response.status_code == 200
    assert again.trace() == [
        "message:user",
        "status:pending",
        "preview_reset",
        "status:running",
        "message_part*",
        "message:assistant",
        "preview_reset",
        "status:waiting",
    ]


async def test_interrupt_always_ok_and_settles_at_once(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        interrupt = f"{wire.prefix}/{chat_id}/interrupt"
        idle = await wire.http.post(interrupt)
        assert idle.status_code == 409  # era C: an idle chat is not interruptible

        sim.config.era_b.interrupt_always_ok = True
        idle = await wire.http.post(interrupt)
        assert idle.status_code == 200, idle.text
        assert idle.json()["status"] == "waiting"

        async with wire.stream(chat_id, after_id=last) as reader:
            await wire.send(chat_id, "/sleep 2 long job")
            await reader.until_status("running")
            mark = len(reader.events)
            busy = await wire.http.post(interrupt)
            assert busy.status_code == 200
            assert busy.json()["status"] == "waiting"  # never "interrupting"
            await reader.until_status("waiting")
    assert since(reader, mark) == ["status:waiting"]
    assert "status:interrupting" not in kinds(reader.events)
    assert [m.role for m in sim.messages(chat_id)][-1] == "user"


async def test_archive_interrupts_an_active_chat(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        url = f"{wire.prefix}/{chat_id}"
        async with wire.stream(chat_id, after_id=last) as reader, watching(wire) as watch:
            await wire.send(chat_id, "/sleep 2 busy")
            await reader.until_status("running")
            refused = await wire.http.patch(url, json={"archived": True})
            assert refused.status_code == 409  # era C refuses to archive a busy chat
            assert refused.json()["message"] == (
                "Cannot archive an active chat. Interrupt or wait for the chat to finish first."
            )

            sim.config.era_b.archive_interrupts = True
            mark = len(reader.events)
            archived = await wire.http.patch(url, json={"archived": True})
            assert archived.status_code == 204, archived.text
            await reader.until_status("waiting")
            deleted = await watch.until(lambda e: e["kind"] == "deleted")
        assert since(reader, mark) == ["status:waiting"]
        assert (deleted["chat"]["status"], deleted["chat"]["archived"]) == ("waiting", True)
        chat = (await wire.http.get(url)).json()
    assert (chat["status"], chat["archived"]) == ("waiting", True)


async def test_deltas_without_coordinates(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        sim.config.era_b.deltas_without_coordinates = True
        async with wire.stream(chat_id, after_id=last) as reader:
            await reader.frame()
            await wire.send(chat_id, "/deltas 3 no coordinates")
            await reader.until_status("waiting")
    parts = [e["message_part"] for e in of_type(reader.events, "message_part")]
    assert len(parts) == 3
    for part in parts:
        assert set(part) == {"role", "part"}
    (answer,) = committed(reader.events, "assistant")
    assert "".join(p["part"]["text"] for p in parts) == answer["content"][0]["text"]


async def test_error_before_status(sim: Simulator) -> None:
    sim.config.era_b.error_before_status = True
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        failed = await told(wire, chat_id, last, "/fail fatal", until="error")
        assert failed.trace() == [
            "message:user",
            "status:running",
            "preview_reset",
            "error",
            "status:error",
        ]
        # A fresh socket's snapshot keeps the same old order.
        async with wire.stream(chat_id) as reader:
            frame = await reader.frame()
    assert kinds(frame)[-3:] == ["error", "status:error", "preview_reset"]
    assert frame[-3]["error"]["kind"] == "config"


async def test_experimental_routes_only(sim: Simulator) -> None:
    async with Wire(sim, prefix=EXP) as wire:
        patched = await wire.http.patch(
            "/simulator/v1/config", json={"era_b": {"experimental_routes_only": True}}
        )
        assert patched.status_code == 200, patched.text
        assert patched.json()["era_b"]["experimental_routes_only"] is True

        v2 = await wire.http.post(V2, json=wire.create_body("on v2"))
        assert v2.status_code == 404
        chat = await wire.create("/deltas 2 on experimental")
        await sim.wait_for_status(chat["id"], "waiting")
        assert (await wire.http.get(f"{V2}/{chat['id']}")).status_code == 404

        for path in (f"{V2}/{chat['id']}/stream", f"{V2}/watch"):
            with pytest.raises(InvalidStatus) as caught:
                async with websockets.connect(wire.ws_url(path), additional_headers=wire.headers):
                    pass
            assert caught.value.response.status_code == 404
            assert json.loads(caught.value.response.body or b"{}")["message"]

        async with wire.stream(chat["id"]) as reader:
            frame = await reader.frame()
    assert kinds(frame) == ["message:user", "message:assistant", "status:waiting", "preview_reset"]
