"""First sync, ``after_id``, reconnects and history rewrites on ``/stream`` (wire reference 5.3-5.5)."""

from __future__ import annotations

import json
import uuid

import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from coder_chat.simulator import Simulator

from .streams import (
    ASK,
    STREAMED_ANSWER,
    committed,
    delta_text,
    of_type,
    settled_chat,
    since,
    text_of,
    told,
)
from .wire import Event, Reader, Wire, collapse_parts, kinds

NOT_FOUND = "Resource not found or you do not have access to this resource"


def seqs(events: list[Event]) -> list[int]:
    return [e["message_part"]["seq"] for e in of_type(events, "message_part")]


def episodes(events: list[Event]) -> set[tuple[int, int]]:
    return {
        (e["message_part"]["history_version"], e["message_part"]["generation_attempt"])
        for e in of_type(events, "message_part")
    }


async def read_until_closed(reader: Reader) -> ConnectionClosed:
    with pytest.raises(ConnectionClosed) as caught:
        while True:
            await reader.frame()
    return caught.value


# -- first sync (5.3) ----------------------------------------------------------------------------
async def test_first_sync_of_idle_chat_is_one_snapshot_frame(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, _ = await settled_chat(sim, wire)
        async with wire.stream(chat_id) as reader:
            frame = await reader.frame()
    assert kinds(frame) == ["message:user", "message:assistant", "status:waiting", "preview_reset"]
    assert [e["message"]["id"] for e in of_type(frame, "message")] == [
        m.id for m in sim.messages(chat_id)
    ]
    # No queue_update: this chat's queue never changed.


async def test_first_sync_order_history_queue_status_action_preview(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat = await wire.create(
            '/tool ask_user {"question": "now?"} paused', unsafe_dynamic_tools=[ASK]
        )
        chat_id = chat["id"]
        await sim.wait_for_status(chat_id, "requires_action")
        queued = (await wire.send(chat_id, "later")).json()
        assert queued["queued"] is True
        async with wire.stream(chat_id) as reader:
            frame = await reader.frame()
        assert kinds(frame) == [
            "message:user",
            "message:assistant",
            "queue_update",
            "status:requires_action",
            "action_required",
            "preview_reset",
        ]
        (entry,) = frame[2]["queued_messages"]
        assert entry == queued["queued_message"]
        (call,) = frame[4]["action_required"]["tool_calls"]
        assert call["tool_name"] == "ask_user"

        posted = await wire.http.post(
            f"{wire.prefix}/{chat_id}/tool-results",
            json={"results": [{"tool_call_id": call["tool_call_id"], "output": "now"}]},
        )
        assert posted.status_code == 204
        await sim.wait_for_status(chat_id, "waiting")
        last = sim.messages(chat_id)[-1].id
        # The queue is empty again, but it changed once: a fresh socket still hears about it.
        async with wire.stream(chat_id, after_id=last) as reader:
            frame = await reader.frame()
    assert kinds(frame) == ["queue_update", "status:waiting", "preview_reset"]
    assert frame[0]["queued_messages"] == []


async def test_first_sync_of_errored_chat_sends_error_after_status(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat = await wire.create("/fail retryable")
        await sim.wait_for_status(chat["id"], "error")
        async with wire.stream(chat["id"]) as reader:
            frame = await reader.frame()
    assert kinds(frame) == ["message:user", "status:error", "error", "preview_reset"]
    assert frame[2]["error"] == sim.chat(chat["id"]).last_error
    assert frame[2]["error"]["retryable"] is True


async def test_after_id_filters_the_first_sync_only(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, first_answer = await settled_chat(sim, wire, "turn one")
        await wire.send(chat_id, "turn two")
        await sim.wait_for_status(chat_id, "waiting")
        old_user, _, new_user, new_answer = sim.messages(chat_id)
        async with wire.stream(chat_id, after_id=first_answer) as reader:
            frame = await reader.frame()
            assert kinds(frame) == [
                "message:user",
                "message:assistant",
                "status:waiting",
                "preview_reset",
            ]
            assert [e["message"]["id"] for e in frame[:2]] == [new_user.id, new_answer.id]
            # A revision of a message older than the cursor is still delivered later on.
            mark = len(reader.events)
            sim.revise_message(chat_id, old_user.id, "turn one, edited")
            await reader.until(lambda e: e["type"] == "preview_reset")
    assert since(reader, mark) == ["message:user", "preview_reset"]
    revised = reader.events[mark]["message"]
    assert revised["id"] == old_user.id < first_answer
    assert text_of(revised) == "turn one, edited"


async def test_after_id_past_the_newest_message_sends_no_history(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        async with wire.stream(chat_id, after_id=last + 1000) as reader:
            frame = await reader.frame()
    assert kinds(frame) == ["status:waiting", "preview_reset"]


# -- reconnect (5.5) -----------------------------------------------------------------------------
async def test_reconnect_mid_turn_replays_the_episode_from_seq_1(slow_sim: Simulator) -> None:
    sim = slow_sim
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        async with wire.stream(chat_id, after_id=last) as first:
            await first.until(lambda e: e["type"] == "preview_reset")
            sent = (await wire.send(chat_id, "/deltas 60 a slow reply")).json()
            await first.until(
                lambda e: e["type"] == "message_part" and e["message_part"]["seq"] == 5
            )
        cursor = sent["message"]["id"]  # the highest committed id the client processed
        async with wire.stream(chat_id, after_id=cursor) as second:
            await second.until_status("waiting")
    assert collapse_parts(kinds(second.events)) == [
        "status:running",
        *STREAMED_ANSWER,
        "status:waiting",
    ]
    assert seqs(second.events) == list(range(1, 61))
    assert episodes(second.events) == episodes(first.events)
    replayed = of_type(second.events, "message_part")[: len(of_type(first.events, "message_part"))]
    assert replayed == of_type(first.events, "message_part")
    (answer,) = committed(second.events, "assistant")
    assert answer["id"] > cursor
    assert text_of(answer) == delta_text(second.events)


async def test_server_cut_stream_resumes_on_reconnect(slow_sim: Simulator) -> None:
    sim = slow_sim
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        sim.faults.drop_streams(after_events=6, chat_id=uuid.UUID(chat_id))
        async with wire.stream(chat_id, after_id=last) as first:
            await first.until(lambda e: e["type"] == "preview_reset")
            await wire.send(chat_id, "/deltas 40 interrupted by the network")
            closed = await read_until_closed(first)
        assert closed.rcvd is None  # cut, not closed: no close frame arrived
        assert kinds(first.events) == [
            "status:waiting",
            "preview_reset",
            "message:user",
            "status:running",
            "preview_reset",
            "message_part",
        ]
        cursor = first.events[2]["message"]["id"]
        async with wire.stream(chat_id, after_id=cursor) as second:
            await second.until_status("waiting")
    assert kinds(second.events)[:2] == ["status:running", "preview_reset"]
    assert "message:user" not in kinds(second.events)
    assert seqs(second.events) == list(range(1, 41))
    assert of_type(second.events, "message_part")[0] == of_type(first.events, "message_part")[0]


async def test_action_required_is_redelivered_on_reconnect(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire, unsafe_dynamic_tools=[ASK])
        sim.faults.withhold_action_required(chat_id=uuid.UUID(chat_id))
        async with wire.stream(chat_id, after_id=last) as lossy:
            await lossy.until(lambda e: e["type"] == "preview_reset")
            await wire.send(chat_id, '/tool ask_user {"question": "still there?"} ping')
            await lossy.until_status("requires_action")
            cursor = sim.messages(chat_id)[-1].id
            calls = []
            for _ in range(2):  # every reconnect to the paused chat re-derives the calls
                async with wire.stream(chat_id, after_id=cursor) as again:
                    frame = await again.frame()
                assert kinds(frame) == [
                    "status:requires_action",
                    "action_required",
                    "preview_reset",
                ]
                calls.append(frame[1]["action_required"]["tool_calls"])
            # The withheld socket never got it, and gets nothing more until something changes.
            await wire.send(chat_id, "queued meanwhile")
            await lossy.until(lambda e: e["type"] == "queue_update")
    assert calls[0] == calls[1]
    (call,) = calls[0]
    assert json.loads(call["args"]) == {"question": "still there?"}
    assert "action_required" not in kinds(lossy.events)
    assert kinds(lossy.events)[-2:] == ["status:requires_action", "queue_update"]


# -- upgrade rejections and the read-only rule (5.1) ---------------------------------------------
@pytest.mark.parametrize("after_id", ["abc", "1.5", "12x"])
async def test_bad_after_id_is_a_400_before_the_upgrade(sim: Simulator, after_id: str) -> None:
    async with Wire(sim) as wire:
        chat_id, _ = await settled_chat(sim, wire)
        url = wire.ws_url(f"{wire.prefix}/{chat_id}/stream?after_id={after_id}")
        with pytest.raises(InvalidStatus) as caught:
            async with websockets.connect(url, additional_headers=wire.headers):
                pass
    assert caught.value.response.status_code == 400
    assert json.loads(caught.value.response.body or b"{}") == {
        "message": "Invalid after_id parameter."
    }


@pytest.mark.parametrize(
    ("chat_id", "status", "message"),
    [
        ("6f1c2d4e-8a9b-4c3d-9e0f-1a2b3c4d5e6f", 404, NOT_FOUND),
        ("not-a-uuid", 400, None),
    ],
)
async def test_unknown_or_malformed_chat_is_rejected_before_the_upgrade(
    sim: Simulator, chat_id: str, status: int, message: str | None
) -> None:
    async with Wire(sim) as wire:
        url = wire.ws_url(f"{wire.prefix}/{chat_id}/stream")
        with pytest.raises(InvalidStatus) as caught:
            async with websockets.connect(url, additional_headers=wire.headers):
                pass
    assert caught.value.response.status_code == status
    body = json.loads(caught.value.response.body or b"{}")
    if message is not None:
        assert body["message"] == message
    else:
        assert "UUID" in body["message"]


async def test_stream_upgrade_needs_a_token(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, _ = await settled_chat(sim, wire)
        url = wire.ws_url(f"{wire.prefix}/{chat_id}/stream")
        with pytest.raises(InvalidStatus) as caught:
            async with websockets.connect(url):
                pass
        assert caught.value.response.status_code == 401
        # The query-parameter form of the token is accepted (browser WebSockets, 1.2).
        async with websockets.connect(f"{url}?coder_session_token={sim.token}") as ws:
            frame = json.loads(await ws.recv())
    assert [e["type"] for e in frame][-2:] == ["status", "preview_reset"]


async def test_client_data_frame_makes_the_server_close(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, _ = await settled_chat(sim, wire)
        async with wire.stream(chat_id) as reader:
            await reader.frame()
            await reader.ws.send('{"type": "ping"}')
            closed = await read_until_closed(reader)
        assert closed.rcvd is not None
        assert closed.rcvd.code == 1008  # policy violation
        # The chat is unharmed; a new socket works.
        async with wire.stream(chat_id) as reader:
            frame = await reader.frame()
    assert kinds(frame)[-2:] == ["status:waiting", "preview_reset"]


# -- history rewrites (5.3) ----------------------------------------------------------------------
async def test_history_reset_resends_every_visible_message(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, _ = await settled_chat(sim, wire, "one")
        await wire.send(chat_id, "two")
        await sim.wait_for_status(chat_id, "waiting")
        last = sim.messages(chat_id)[-1].id
        async with wire.stream(chat_id, after_id=last) as reader:
            await reader.frame()
            mark = len(reader.events)
            sim.reset_history(chat_id)
            await reader.until(lambda e: e["type"] == "preview_reset")
    # after_id is ignored: the reset is followed by the full history, then preview_reset.
    assert since(reader, mark) == [
        "history_reset",
        "message:user",
        "message:assistant",
        "message:user",
        "message:assistant",
        "preview_reset",
    ]
    resent = [e["message"] for e in of_type(reader.events[mark:], "message")]
    assert [m["id"] for m in resent] == [m.id for m in sim.messages(chat_id)]
    assert resent == [m.to_wire() for m in sim.messages(chat_id)]


async def test_history_reset_via_the_admin_route(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        url = f"/simulator/v1/chats/{chat_id}/history-reset"
        unauthorized = await wire.http.post(url, headers={"Coder-Session-Token": "wrong"})
        assert unauthorized.status_code == 401
        async with wire.stream(chat_id, after_id=last) as reader:
            await reader.frame()
            mark = len(reader.events)
            response = await wire.http.post(url)
            assert response.status_code == 200, response.text
            assert response.json()["id"] == chat_id
            await reader.until(lambda e: e["type"] == "preview_reset")
    assert since(reader, mark) == [
        "history_reset",
        "message:user",
        "message:assistant",
        "preview_reset",
    ]


async def test_revision_resends_the_same_id_with_new_content(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, answer_id = await settled_chat(sim, wire)
        async with wire.stream(chat_id) as reader:
            snapshot = await reader.frame()
            mark = len(reader.events)
            revised = sim.revise_message(chat_id, answer_id, "a better answer")
            await reader.until(lambda e: e["type"] == "preview_reset")
        (event,) = of_type(reader.events[mark:], "message")
        assert since(reader, mark) == ["message:assistant", "preview_reset"]
        original = next(
            e["message"]
            for e in snapshot
            if e["type"] == "message" and e["message"]["id"] == answer_id
        )
        assert event["message"]["id"] == answer_id == revised.id
        assert text_of(event["message"]) == "a better answer" != text_of(original)
        page = await wire.messages(chat_id)
    (listed,) = [m for m in page["messages"] if m["id"] == answer_id]
    assert listed["content"] == event["message"]["content"]


# -- retries, queue promotion, delta/commit agreement (5.3, 5.4) ---------------------------------
async def test_retry_bumps_the_generation_attempt_and_restarts_seq(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        sim.faults.retry_generation(chat_id=uuid.UUID(chat_id))
        retried = await told(wire, chat_id, last, "/deltas 6 retry me")
    assert retried.trace() == [
        "message:user",
        "status:running",
        "preview_reset",
        "message_part*",
        "retry",
        *STREAMED_ANSWER,
        "status:waiting",
    ]
    events = retried.events
    cut = next(i for i, e in enumerate(events) if e["type"] == "retry")
    before, after = events[:cut], events[cut:]
    assert seqs(before) == [1, 2, 3]
    assert seqs(after) == [1, 2, 3, 4, 5, 6]
    ((hv, attempt),) = episodes(before)
    assert episodes(after) == {(hv, attempt + 1)}
    retry = events[cut]["retry"]
    assert retry["attempt"] == 1
    assert {"attempt", "delay_ms", "error", "retrying_at"} <= set(retry)
    assert retry["kind"] == "overloaded"
    (answer,) = committed(events, "assistant")
    assert text_of(answer) == delta_text(after) == 'You said: "retry me"'


async def test_finished_turn_promotes_the_queued_prompt_without_status(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire, unsafe_dynamic_tools=[ASK])
        async with wire.stream(chat_id, after_id=last) as reader:
            await wire.send(chat_id, "/tool ask_user {} first")
            action = await reader.until(lambda e: e["type"] == "action_required")
            queued = (await wire.send(chat_id, "second")).json()
            assert queued["queued"] is True
            await reader.until(lambda e: e["type"] == "queue_update")
            mark = len(reader.events)
            (call,) = action["action_required"]["tool_calls"]
            await wire.http.post(
                f"{wire.prefix}/{chat_id}/tool-results",
                json={"results": [{"tool_call_id": call["tool_call_id"], "output": 7}]},
            )
            await reader.until_status("waiting")
    assert since(reader, mark) == [
        "message:tool",
        "status:running",
        *STREAMED_ANSWER,
        "message:user",
        "queue_update",
        *STREAMED_ANSWER,
        "status:waiting",
    ]
    promoted = committed(reader.events[mark:], "user")[0]
    assert promoted["content"] == queued["queued_message"]["content"]
    assert of_type(reader.events[mark:], "queue_update")[0]["queued_messages"] == []


@pytest.mark.parametrize("count", [1, 3, 7, 40])
async def test_delta_text_concatenates_to_the_committed_message(sim: Simulator, count: int) -> None:
    async with Wire(sim) as wire:
        chat_id, last = await settled_chat(sim, wire)
        async with wire.stream(chat_id, after_id=last) as reader:
            await reader.frame()
            await wire.send(chat_id, f"/deltas {count} stitch me")
            await reader.until_status("waiting")
    parts = of_type(reader.events, "message_part")
    assert len(parts) == count
    assert all(p["message_part"]["part"]["text"] for p in parts)
    (answer,) = committed(reader.events, "assistant")
    assert text_of(answer) == delta_text(reader.events)
    assert text_of(answer).startswith('You said: "stitch me"')
