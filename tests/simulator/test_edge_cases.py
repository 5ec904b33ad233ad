"""Edge cases found in review: strict parsing, refused knobs, era-B pending, undeclared tools."""

from __future__ import annotations

import httpx
import pytest
import websockets

from coder_chat.simulator import DirectiveError, Simulator, parse
from coder_chat.simulator.faults import UnknownRoute

from .wire import V2, Wire, declare


async def test_undeclared_client_tool_fails_the_turn_with_a_clear_error(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat = await wire.create("/tool lookup {}")
        record = await sim.wait_for_status(chat["id"], "error")
    assert record.last_error is not None
    assert "declares no such client tool" in record.last_error["message"]
    assert record.last_error["retryable"] is False


def test_a_number_argument_must_end_at_whitespace() -> None:
    with pytest.raises(DirectiveError):
        parse("/deltas 3{")
    assert parse("/tool lookup{}").client_tools[0].name == "lookup"


@pytest.mark.parametrize("raw", [" 5", "1_000", "99999999999999999999", "+"])
async def test_after_id_is_parsed_strictly(sim: Simulator, raw: str) -> None:
    async with Wire(sim) as wire:
        chat = await wire.create("hello")
        url = wire.ws_url(f"{V2}/{chat['id']}/stream?after_id={raw}")
        with pytest.raises(websockets.exceptions.InvalidStatus) as caught:
            async with websockets.connect(url, additional_headers=wire.headers):
                pass
    assert caught.value.response.status_code == 400


def test_websocket_routes_cannot_be_held(sim: Simulator) -> None:
    for knob in (sim.faults.hold, sim.faults.cut_after_commit, sim.faults.cut_before_commit):
        with pytest.raises(UnknownRoute, match="WebSocket upgrade"):
            knob("stream")
    with pytest.raises(UnknownRoute):
        sim.faults.delay_commit("watch", 1.0)


async def test_admin_refuses_to_clear_anything_but_the_request_log(sim: Simulator) -> None:
    headers = {"Coder-Session-Token": sim.token}
    async with httpx.AsyncClient(base_url=sim.base_url, headers=headers) as http:
        refused = await http.delete("/simulator/v1/records/effects")
        assert refused.status_code == 400
        cleared = await http.delete("/simulator/v1/records/requests")
        assert cleared.status_code == 200
        counted = await http.post(
            "/simulator/v1/faults/stream-drop", json={"after_events": 1, "times": "2"}
        )
        assert counted.status_code == 200
        assert counted.json()["stream_drops"][0]["remaining"] == 2


async def test_era_b_pending_passes_to_running_after_tool_results(sim: Simulator) -> None:
    sim.config.era_b.pending_status = True
    async with Wire(sim) as wire:
        chat = await wire.create("/tool lookup {}", **declare("lookup"))
        record = await sim.wait_for_status(chat["id"], "requires_action")
        call = record.pending_calls[0].tool_call_id
        async with wire.stream(chat["id"]) as reader:
            await reader.until_status("requires_action")
            body = {"results": [{"tool_call_id": call, "output": "ok"}]}
            assert (
                await wire.http.post(f"{V2}/{chat['id']}/tool-results", json=body)
            ).status_code == 204
            await reader.until_status("waiting")
    statuses = [e["status"]["status"] for e in reader.events if e["type"] == "status"]
    assert statuses[-3:] == ["pending", "running", "waiting"]
