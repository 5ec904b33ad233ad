"""The canonical era-C stream timelines (wire reference 5.7) and the stream framing (5.2, 5.3).

Every test talks to a real simulator over loopback sockets with plain httpx and
websockets. Most timelines start from a settled chat whose stream is already
open when the prompt is sent, so the moment the model starts is deterministic;
the create-time timeline uses ``/sleep`` to leave room for the connect.
"""

from __future__ import annotations

import json

import pytest

from coder_chat.simulator import Simulator

from .streams import (
    ASK,
    STREAMED_ANSWER,
    TOOL_CALL,
    committed,
    delta_text,
    of_type,
    settled_chat,
    since,
    text_of,
)
from .wire import Wire, collapse_parts, kinds

#: The one payload field each event type carries besides ``type`` and ``chat_id`` (5.2).
PAYLOAD: dict[str, set[str]] = {
    "message": {"message"},
    "message_part": {"message_part"},
    "status": {"status"},
    "error": {"error"},
    "retry": {"retry"},
    "queue_update": {"queued_messages"},
    "action_required": {"action_required"},
    "preview_reset": set(),
    "history_reset": set(),
}


# -- 5.7.1 plain turn --------------------------------------------------------------------------
async def test_plain_turn_after_create(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat = await wire.create("/sleep 0.2 /deltas 3 plain turn")
        async with wire.stream(chat["id"]) as reader:
            await reader.until_status("waiting")
    assert kinds(reader.events) == [
        "message:user",
        "status:running",
        "preview_reset",
        "message_part",
        "message_part",
        "message_part",
        "message:assistant",
        "preview_reset",
        "status:waiting",
    ]
    (user,) = committed(reader.events, "user")
    assert user["content"] == [{"type": "text", "text": "/sleep 0.2 /deltas 3 plain turn"}]
    (assistant,) = committed(reader.events, "assistant")
    assert assistant["id"] > user["id"]
    assert set(assistant["usage"]) >= {"input_tokens", "output_tokens", "total_tokens"}
    assert text_of(assistant) == delta_text(reader.events) == 'You said: "plain turn"'
    for part in of_type(reader.events, "message_part"):
        assert part["message_part"]["role"] == "assistant"
        assert part["message_part"]["part"]["type"] == "text"


async def test_plain_turn_after_send(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        async with wire.stream(chat_id, after_id=last) as reader:
            await reader.until(lambda e: e["type"] == "preview_reset")
            response = await wire.send(chat_id, "/deltas 2 second turn")
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["queued"] is False
            await reader.until_status("waiting")
    assert kinds(reader.events) == [
        "status:waiting",
        "preview_reset",
        "message:user",
        "status:running",
        "preview_reset",
        "message_part",
        "message_part",
        "message:assistant",
        "preview_reset",
        "status:waiting",
    ]
    (user,) = committed(reader.events, "user")
    assert user["id"] == body["message"]["id"] > last


# -- 5.7.2 server tool step --------------------------------------------------------------------
async def test_server_tool_step(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        async with wire.stream(chat_id, after_id=last) as reader:
            await reader.until(lambda e: e["type"] == "preview_reset")
            mark = len(reader.events)
            response = await wire.send(
                chat_id, '/server-tool lookup {"query": "a b", "n": 2} /deltas 2 find it'
            )
            assert response.status_code == 200, response.text
            await reader.until_status("waiting")
    assert since(reader, mark) == [
        "message:user",
        "status:running",
        *STREAMED_ANSWER,
        "message:tool",
        *STREAMED_ANSWER,
        "status:waiting",
    ]
    call_step, final = committed(reader.events, "assistant")
    (call,) = [p for p in call_step["content"] if p["type"] == "tool-call"]
    assert call["tool_name"] == "lookup"
    assert call["args"] == {"query": "a b", "n": 2}
    assert not call.get("provider_executed", False)
    (tool,) = committed(reader.events, "tool")
    (result,) = tool["content"]
    assert result["type"] == "tool-result"
    assert result["tool_call_id"] == call["tool_call_id"]
    assert result["tool_name"] == "lookup"
    assert result["is_error"] is False
    assert call_step["id"] < tool["id"] < final["id"]
    assert text_of(final) == 'lookup ran on the server. You said: "find it"'
    assert [(e.tool_name, e.args) for e in sim.records.effects] == [
        ("lookup", {"query": "a b", "n": 2})
    ]


# -- 5.7.3 client tool -------------------------------------------------------------------------
async def test_client_tool_round_trip(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire, unsafe_dynamic_tools=[ASK])
        async with wire.stream(chat_id, after_id=last) as reader:
            await reader.until(lambda e: e["type"] == "preview_reset")
            mark = len(reader.events)
            await wire.send(chat_id, '/tool ask_user {"question": "why?"} need input')
            action = await reader.until(lambda e: e["type"] == "action_required")
            assert since(reader, mark) == [
                "message:user",
                "status:running",
                *TOOL_CALL,
            ]
            (call_step,) = committed(reader.events, "assistant")
            (call,) = call_step["content"]
            assert call["type"] == "tool-call"
            assert call["tool_name"] == "ask_user"
            assert call["args"] == {"question": "why?"}
            (pending,) = action["action_required"]["tool_calls"]
            assert pending["tool_call_id"] == call["tool_call_id"]
            assert pending["tool_name"] == "ask_user"
            assert isinstance(pending["args"], str)  # the raw JSON text of the arguments
            assert json.loads(pending["args"]) == {"question": "why?"}

            mark = len(reader.events)
            posted = await wire.http.post(
                f"{wire.prefix}/{chat_id}/tool-results",
                json={"results": [{"tool_call_id": call["tool_call_id"], "output": {"a": 42}}]},
            )
            assert posted.status_code == 204, posted.text
            await reader.until_status("waiting")
    assert since(reader, mark) == [
        "message:tool",
        "status:running",
        *STREAMED_ANSWER,
        "status:waiting",
    ]
    (tool,) = committed(reader.events, "tool")
    assert tool["content"] == [
        {
            "type": "tool-result",
            "tool_call_id": call["tool_call_id"],
            "tool_name": "ask_user",
            "result": {"a": 42},
            "is_error": False,
        }
    ]
    final = committed(reader.events, "assistant")[-1]
    assert text_of(final) == 'ask_user returned {"a": 42}. You said: "need input"'


async def test_client_tool_deadline_answers_with_error_and_recalls(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire, unsafe_dynamic_tools=[ASK])
        async with wire.stream(chat_id, after_id=last) as reader:
            await wire.send(chat_id, '/tool ask_user {"question": "q"} slow human')
            first = await reader.until(lambda e: e["type"] == "action_required")
            (first_call,) = first["action_required"]["tool_calls"]
            mark = len(reader.events)
            sim.time_out_tools(chat_id)
            second = await reader.until(lambda e: e["type"] == "action_required")
            assert since(reader, mark) == [
                "message:tool",
                "status:running",
                *TOOL_CALL,
            ]
            (timed_out,) = committed(reader.events, "tool")
            (result,) = timed_out["content"]
            assert result["tool_call_id"] == first_call["tool_call_id"]
            assert result["is_error"] is True
            assert result["result"] == "Tool execution timed out"
            (again,) = second["action_required"]["tool_calls"]
            assert again["tool_name"] == "ask_user"
            assert again["args"] == first_call["args"]
            assert again["tool_call_id"] != first_call["tool_call_id"]
            posted = await wire.http.post(
                f"{wire.prefix}/{chat_id}/tool-results",
                json={"results": [{"tool_call_id": again["tool_call_id"], "output": "ok"}]},
            )
            assert posted.status_code == 204, posted.text
            await reader.until_status("waiting")


# -- 5.7.4 failure -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "kind", "retryable"),
    [("retryable", "overloaded", True), ("fatal", "config", False)],
)
async def test_failure_ends_with_status_error_then_error(
    sim: Simulator, mode: str, kind: str, retryable: bool
) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        async with wire.stream(chat_id, after_id=last) as reader:
            await reader.until(lambda e: e["type"] == "preview_reset")
            mark = len(reader.events)
            await wire.send(chat_id, f"/fail {mode}")
            error = await reader.until(lambda e: e["type"] == "error")
        assert since(reader, mark) == [
            "message:user",
            "status:running",
            "preview_reset",
            "status:error",
            "error",
        ]
        payload = error["error"]
        assert payload["kind"] == kind
        assert payload["retryable"] is retryable
        assert payload["message"]
        chat = (await wire.http.get(f"{wire.prefix}/{chat_id}")).json()
        assert chat["status"] == "error"
        assert chat["last_error"] == payload


# -- 5.7.5 interrupt while running -------------------------------------------------------------
async def test_interrupt_while_sleeping(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        async with wire.stream(chat_id, after_id=last) as reader:
            await wire.send(chat_id, "/sleep 2 hold on")
            await reader.until_status("running")
            mark = len(reader.events)
            response = await wire.http.post(f"{wire.prefix}/{chat_id}/interrupt")
            assert response.status_code == 200, response.text
            assert response.json()["status"] == "interrupting"
            await reader.until_status("waiting")
        # Nothing was generated before the interrupt, so nothing partial is committed.
        assert since(reader, mark) == ["status:interrupting", "status:waiting"]
        assert [m.role for m in sim.messages(chat_id)][-1] == "user"
        again = await wire.http.post(f"{wire.prefix}/{chat_id}/interrupt")
        assert again.status_code == 409
        assert again.json()["message"] == "Chat is not in an interruptible state."


async def test_interrupt_mid_stream_commits_partial_output(slow_sim: Simulator) -> None:
    sim = slow_sim
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        async with wire.stream(chat_id, after_id=last) as reader:
            await wire.send(chat_id, "/deltas 60 a long answer")
            await reader.until(
                lambda e: e["type"] == "message_part" and e["message_part"]["seq"] == 3
            )
            response = await wire.http.post(f"{wire.prefix}/{chat_id}/interrupt")
            assert response.json()["status"] == "interrupting"
            await reader.until_status("waiting")
    trace = collapse_parts(kinds(reader.events))
    assert trace[-5:] == [
        "message_part*",
        "status:interrupting",
        "message:assistant",
        "status:waiting",
        "preview_reset",
    ]
    (partial,) = committed(reader.events, "assistant")
    streamed = delta_text(reader.events)
    assert text_of(partial) == streamed
    full = 'You said: "a long answer"'.ljust(60, ".")
    assert full.startswith(streamed)
    assert 3 <= len(streamed) < len(full)


# -- 5.7.6 prompt queued during a turn ---------------------------------------------------------
async def test_prompt_queued_during_turn_is_promoted_without_status(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        async with wire.stream(chat_id, after_id=last) as reader:
            await reader.until(lambda e: e["type"] == "preview_reset")
            mark = len(reader.events)
            await wire.send(chat_id, "/sleep 0.3 first")
            queued = await wire.send(chat_id, "second")
            body = queued.json()
            assert body["queued"] is True, "the first turn ended before the second send"
            await reader.until_status("waiting")
    assert since(reader, mark) == [
        "message:user",
        "status:running",
        "preview_reset",
        "queue_update",
        "message_part*",
        "message:assistant",
        "preview_reset",
        "message:user",
        "queue_update",
        *STREAMED_ANSWER,
        "status:waiting",
    ]
    first_update, second_update = of_type(reader.events, "queue_update")
    (entry,) = first_update["queued_messages"]
    assert entry["id"] == body["queued_message"]["id"]
    assert entry["content"] == [{"type": "text", "text": "second"}]
    assert second_update["queued_messages"] == []
    _, promoted = committed(reader.events, "user")
    assert promoted["content"] == entry["content"]
    first_answer, second_answer = committed(reader.events, "assistant")
    assert first_answer["id"] < promoted["id"] < second_answer["id"]
    assert text_of(second_answer) == 'You said: "second"'


async def test_send_with_busy_behavior_interrupt_promotes_after_wind_down(
    sim: Simulator,
) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        async with wire.stream(chat_id, after_id=last) as reader:
            await wire.send(chat_id, "/sleep 2 first")
            await reader.until_status("running")
            mark = len(reader.events)
            response = await wire.send(chat_id, "second", busy_behavior="interrupt")
            assert response.json()["queued"] is True
            await reader.until_status("waiting")
    assert since(reader, mark) == [
        "queue_update",
        "status:interrupting",
        "message:user",
        "queue_update",
        "status:running",
        *STREAMED_ANSWER,
        "status:waiting",
    ]
    assert text_of(committed(reader.events, "assistant")[-1]) == 'You said: "second"'


# -- framing (5.2) and episode coordinates (5.3) -----------------------------------------------
async def test_every_frame_is_an_array_of_enveloped_events(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, _ = await settled_chat(sim, wire, unsafe_dynamic_tools=[ASK])
        async with wire.stream(chat_id) as reader:
            await wire.send(chat_id, "/server-tool probe {} /tool ask_user {} go")
            action = await reader.until(lambda e: e["type"] == "action_required")
            await wire.send(chat_id, "queued while paused")
            (call,) = action["action_required"]["tool_calls"]
            await wire.http.post(
                f"{wire.prefix}/{chat_id}/tool-results",
                json={"results": [{"tool_call_id": call["tool_call_id"], "output": 1}]},
            )
            await reader.until_status("waiting")
    assert reader.frames
    seen: set[str] = set()
    for frame in reader.frames:
        assert isinstance(frame, list) and frame, frame
        for event in frame:
            assert event["chat_id"] == chat_id
            assert set(event) - {"type", "chat_id"} == PAYLOAD[event["type"]], event
            seen.add(event["type"])
    assert seen == {
        "message",
        "message_part",
        "status",
        "queue_update",
        "action_required",
        "preview_reset",
    }
    for event in of_type(reader.events, "status"):
        assert set(event["status"]) == {"status"}


async def test_delta_seq_starts_at_one_per_episode_and_is_contiguous(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        async with wire.stream(chat_id, after_id=last) as reader:
            await reader.until(lambda e: e["type"] == "preview_reset")
            await wire.send(chat_id, "/server-tool a {} /server-tool b {} /deltas 5 three steps")
            await reader.until_status("waiting")
    episodes: list[tuple[int, int]] = []
    expected = 1
    for event in reader.events:
        if event["type"] == "preview_reset":
            expected = 1
        elif event["type"] == "message_part":
            part = event["message_part"]
            assert part["seq"] == expected, part
            coordinates = (part["history_version"], part["generation_attempt"])
            if expected == 1:
                episodes.append(coordinates)
            assert coordinates == episodes[-1]
            expected += 1
    # Two narrated server-tool steps and the answer: three episodes, history moving forward.
    assert len(episodes) == 3
    assert [hv for hv, _ in episodes] == sorted({hv for hv, _ in episodes})
    assert all(isinstance(hv, int) and isinstance(ga, int) for hv, ga in episodes)


async def test_large_snapshot_is_split_into_frames_of_256_events(sim: Simulator) -> None:
    tools = " ".join(f"/server-tool t{i} {{}}" for i in range(130))
    async with Wire(sim) as wire:
        chat_id, _ = await settled_chat(sim, wire, f"{tools} many steps")
        visible = sim.messages(chat_id)
        assert len(visible) == 262  # user, 130 x (call, result), answer
        async with wire.stream(chat_id) as reader:
            await reader.frame()
            await reader.frame()
    assert [len(f) for f in reader.frames] == [256, 8]
    assert kinds(reader.events)[-2:] == ["status:waiting", "preview_reset"]
    ids = [e["message"]["id"] for e in of_type(reader.events, "message")]
    assert ids == [m.id for m in visible]
    assert ids == sorted(ids)
