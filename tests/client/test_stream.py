"""``ChatStream`` over real sockets: cursor, redials, de-duplication, budget, terminal errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection

from coder_chat import ChatClient, ChatStream
from coder_chat.client.events import TransportEvent, WsOpen
from coder_chat.errors import CoderApiError, CoderStreamError
from coder_chat.protocol.models import (
    AnyEvent,
    HistoryResetEvent,
    MessageEvent,
    MessagePartEvent,
    OtherEvent,
    PreviewResetEvent,
    RetryEvent,
    StatusEvent,
)
from coder_chat.simulator import Simulator
from coder_chat.simulator.state import Message

from .helpers import (
    Recorder,
    client_for,
    eventually,
    frame,
    frame_server,
    idle_chat,
    requests_of,
)

V2 = "/api/v2/chats"
EXP = "/api/experimental/chats"


@pytest.fixture
async def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def client(sim: Simulator, recorder: Recorder) -> AsyncIterator[ChatClient]:
    async with client_for(sim, on_transport_event=recorder) as peer:
        yield peer


async def open_stream(client: ChatClient, chat_id: str, after_id: int | None = None) -> ChatStream:
    stream = ChatStream(client, chat_id, after_id, redial_initial=0.01)
    await stream.start()
    return stream


async def exchanged(sim: Simulator, prompt: str) -> tuple[str, Message, Message]:
    """A chat with one finished exchange on ``prompt``: its id, the user's message and the
    answer."""
    chat_id = await idle_chat(sim, prompt)
    user, assistant = sim.messages(chat_id)
    return chat_id, user, assistant


async def read_snapshot(stream: ChatStream) -> list[AnyEvent]:
    """What a stream forwards up to the end of its snapshot (its preview reset)."""
    return await read_until(stream, lambda e: isinstance(e, PreviewResetEvent))


async def read_to_idle(client: ChatClient, chat_id: str) -> list[AnyEvent]:
    """Every event a new stream of the chat forwards until the chat is idle again."""
    stream = await open_stream(client, chat_id)
    events = await read_until(stream, status_is("waiting"))
    await stream.aclose()
    return events


async def read_until(
    stream: ChatStream, stop: Callable[[AnyEvent], bool], timeout: float = 10.0
) -> list[AnyEvent]:
    """Every forwarded event up to and including the first one matching ``stop``."""
    seen: list[AnyEvent] = []
    async with asyncio.timeout(timeout):
        while True:
            event = await stream.next()
            seen.append(event)
            if stop(event):
                return seen


def status_is(*statuses: str) -> Callable[[AnyEvent], bool]:
    return lambda e: isinstance(e, StatusEvent) and e.status.status in statuses


def parts(events: list[AnyEvent]) -> list[MessagePartEvent]:
    return [e for e in events if isinstance(e, MessagePartEvent)]


def messages(events: list[AnyEvent]) -> list[MessageEvent]:
    return [e for e in events if isinstance(e, MessageEvent)]


def assert_contiguous(deltas: list[MessagePartEvent]) -> None:
    """Per episode, the forwarded seqs are exactly 1..n: nothing lost, nothing twice."""
    by_episode: dict[tuple[int | None, int | None], list[int | None]] = {}
    for d in deltas:
        part = d.message_part
        by_episode.setdefault((part.history_version, part.generation_attempt), []).append(part.seq)
    for episode, seqs in by_episode.items():
        assert seqs == list(range(1, len(seqs) + 1)), episode


def delta_text(deltas: list[MessagePartEvent]) -> str:
    return "".join(d.message_part.part.text or "" for d in deltas)


# -- cursor and snapshot --------------------------------------------------------------------------
async def test_snapshot_and_after_id_cursor(
    sim: Simulator, client: ChatClient, recorder: Recorder
) -> None:
    chat_id, user, assistant = await exchanged(sim, "hello")

    full = await open_stream(client, chat_id)
    everything = await read_snapshot(full)
    await full.aclose()
    assert [type(e).__name__ for e in everything] == [
        "MessageEvent",
        "MessageEvent",
        "StatusEvent",
        "PreviewResetEvent",
    ]
    assert [m.message.id for m in messages(everything)] == [user.id, assistant.id]
    assert full.cursor == assistant.id

    resumed = await open_stream(client, chat_id, after_id=user.id)
    tail = await read_until(resumed, lambda e: isinstance(e, PreviewResetEvent))
    await resumed.aclose()
    assert [m.message.id for m in messages(tail)] == [assistant.id]
    assert messages(tail)[0].message.text() == 'You said: "hello"'
    assert [d.after_id for d in recorder.dials()] == [None, user.id]


async def test_aclose_stops_the_reader(
    sim: Simulator, client: ChatClient, recorder: Recorder
) -> None:
    chat_id = await idle_chat(sim)
    stream = await open_stream(client, chat_id)
    await read_until(stream, status_is("waiting"))
    await stream.aclose()
    await asyncio.sleep(0.05)  # a redial would have happened by now (backoff 0.01 s)
    assert len(recorder.dials()) == 1
    assert recorder.redials() == []
    # The socket was closed: the server dropped its subscriber.
    await eventually(lambda: not sim.engine.subscribers.get(sim.chat(chat_id).id))


# -- redials: nothing lost, nothing twice ---------------------------------------------------------
async def test_drops_mid_delta_lose_and_duplicate_nothing(
    sim: Simulator, client: ChatClient, recorder: Recorder
) -> None:
    sim.config.delta_interval = 0.002
    chat = await client.create_chat(
        organization_id=str(sim.organization_id), content="/deltas 200 stream me"
    )
    # Each socket is cut after more events than the one before, so every redial, which
    # replays the episode from seq 1, also delivers something new.
    for budget in (40, 90, 150):
        sim.faults.drop_streams(after_events=budget, times=1, chat_id=sim.chat(chat.id).id)
    events = await read_to_idle(client, chat.id)

    (committed,) = [m for m in sim.messages(chat.id) if m.role == "assistant"]
    deltas = parts(events)
    assert_contiguous(deltas)
    assert committed.text().startswith(delta_text(deltas))
    # The stream's own copy of the committed message is forwarded exactly once.
    assert [m.message.id for m in messages(events)] == [m.id for m in sim.messages(chat.id)]
    assert messages(events)[-1].message.text() == committed.text()
    # Three cuts, four sockets; replayed deltas reached the wire and were not forwarded.
    assert len(recorder.dials()) == 4
    assert [d.attempt for d in recorder.dials()] == [1, 2, 3, 4]
    assert len({d.reader for d in recorder.dials()}) == 1
    assert any(not e.forwarded for e in recorder.ws_events() if e.event_type == "message_part")
    assert len(recorder.of("ws:close")) == 3


async def test_redial_resumes_after_the_last_committed_message(
    sim: Simulator, client: ChatClient, recorder: Recorder
) -> None:
    chat_id, user, assistant = await exchanged(sim, "one")
    # The first socket delivers the two messages and is cut; the redial asks for what follows.
    sim.faults.drop_streams(after_events=2, times=1)
    events = await read_to_idle(client, chat_id)
    assert [m.message.id for m in messages(events)] == [user.id, assistant.id]
    assert [d.after_id for d in recorder.dials()] == [None, assistant.id]


async def test_generation_retry_restarts_seq_under_a_new_attempt(
    sim: Simulator, client: ChatClient
) -> None:
    sim.config.delta_interval = 0.002
    sim.faults.retry_generation(times=1)  # armed before the run starts streaming
    chat = await client.create_chat(
        organization_id=str(sim.organization_id), content="/deltas 30 again"
    )
    events = await read_to_idle(client, chat.id)
    (committed,) = [m for m in sim.messages(chat.id) if m.role == "assistant"]
    deltas = parts(events)
    assert_contiguous(deltas)
    attempts = {d.message_part.generation_attempt for d in deltas}
    assert len(attempts) == 2
    assert any(isinstance(e, RetryEvent) for e in events)
    # Honouring preview_reset: the preview after the last reset before the commit is the answer.
    commit_at = next(
        i
        for i, e in enumerate(events)
        if isinstance(e, MessageEvent) and e.message.role == "assistant"
    )
    last_reset = max(
        i for i, e in enumerate(events[:commit_at]) if isinstance(e, PreviewResetEvent)
    )
    assert delta_text(parts(events[last_reset:commit_at])) == committed.text()


async def test_history_reset_and_revisions_are_forwarded(
    sim: Simulator, client: ChatClient, recorder: Recorder
) -> None:
    chat_id, user, assistant = await exchanged(sim, "before")
    stream = await open_stream(client, chat_id)
    await read_snapshot(stream)

    sim.revise_message(chat_id, assistant.id, "revised answer")
    revised = await read_snapshot(stream)
    assert messages(revised)[0].message.id == assistant.id
    assert messages(revised)[0].message.text() == "revised answer"

    sim.reset_history(chat_id)
    after_reset = await read_until(
        stream, lambda e: isinstance(e, MessageEvent) and e.message.id == assistant.id
    )
    await stream.aclose()
    assert isinstance(after_reset[0], HistoryResetEvent)
    # The full history follows the reset, already-seen ids included.
    assert [m.message.id for m in messages(after_reset)] == [user.id, assistant.id]


# -- the redial budget ------------------------------------------------------------------------------
async def test_budget_exhausts_after_five_progressless_failures(
    sim: Simulator, client: ChatClient, recorder: Recorder
) -> None:
    chat_id = await idle_chat(sim)
    sim.faults.drop_streams(after_events=0, times=None)
    stream = await open_stream(client, chat_id)
    with pytest.raises(CoderStreamError) as exhausted:
        await asyncio.wait_for(stream.next(), 10)
    await stream.aclose()
    assert exhausted.value.chat_id == chat_id
    assert "5 consecutive failures" in str(exhausted.value)
    assert exhausted.value.__cause__ is not None
    assert len(recorder.dials()) == 5
    assert [r.consecutive_failures for r in recorder.redials()] == [1, 2, 3, 4]
    assert {r.max_consecutive_failures for r in recorder.redials()} == {5}
    # Backoff doubles from redial_initial (1, 2, 4, 8 s by default; 10 ms here).
    assert [r.backoff for r in recorder.redials()] == [0.01, 0.02, 0.04, 0.08]
    # The error keeps failing the same way for every later reader call.
    with pytest.raises(CoderStreamError):
        stream.next_nowait()


async def test_default_redial_schedule_is_one_two_four_eight(sim: Simulator) -> None:
    async with client_for(sim) as peer:
        stream = ChatStream(peer, "c", None)
    delays = stream._new_backoff()
    assert [next(delays) for _ in range(4)] == [1.0, 2.0, 4.0, 8.0]


@pytest.mark.parametrize("status", [408, 425, 429])
async def test_retryable_upgrade_rejections_count_against_the_budget(
    sim: Simulator, client: ChatClient, recorder: Recorder, status: int
) -> None:
    chat_id = await idle_chat(sim)
    sim.faults.fail_next("stream", status, 5)
    stream = await open_stream(client, chat_id)
    with pytest.raises(CoderStreamError) as exhausted:
        await asyncio.wait_for(stream.next(), 10)
    await stream.aclose()
    assert isinstance(exhausted.value.__cause__, CoderApiError)
    assert exhausted.value.__cause__.status == status
    assert len(recorder.dials()) == 5
    assert [r.status for r in requests_of(sim, "stream")] == [status] * 5


async def test_a_429_burst_shorter_than_the_budget_recovers(
    sim: Simulator, client: ChatClient, recorder: Recorder
) -> None:
    chat_id = await idle_chat(sim)
    sim.faults.fail_next("stream", 429, 4)
    events = await read_to_idle(client, chat_id)
    assert len(messages(events)) == 2
    assert [r.status for r in requests_of(sim, "stream")] == [429, 429, 429, 429, 101]
    assert len(recorder.of("ws:error")) == 4


@pytest.mark.parametrize("status", [401, 403, 404])
async def test_other_4xx_upgrade_rejections_are_terminal(
    sim: Simulator, client: ChatClient, recorder: Recorder, status: int
) -> None:
    chat_id = await idle_chat(sim)
    sim.faults.fail_next("stream", status)
    stream = await open_stream(client, chat_id)
    with pytest.raises(CoderApiError) as rejected:
        await asyncio.wait_for(stream.next(), 10)
    await stream.aclose()
    assert rejected.value.status == status
    assert rejected.value.method == "GET"
    assert rejected.value.path.endswith(f"/{chat_id}/stream")
    assert rejected.value.message == f"Simulated failure ({status})."
    assert len(recorder.dials()) == 1
    assert recorder.redials() == []


async def test_only_forward_progress_resets_the_budget(sim: Simulator, recorder: Recorder) -> None:
    """Eight failures in all, but never five in a row without progress: the stream survives."""
    chat_id = await idle_chat(sim)

    def arm_more_failures(event: TransportEvent) -> None:
        recorder(event)
        if isinstance(event, WsOpen) and event.attempt == 5:
            # The socket that just opened delivers one new message, then is cut (below).
            # Four failures in a row may follow: the cut itself and three rejections.
            sim.faults.fail_next("stream", 429, 3)

    sim.faults.fail_next("stream", 429, 4)
    sim.faults.drop_streams(after_events=1, times=1)
    async with client_for(sim, on_transport_event=arm_more_failures) as peer:
        stream = await open_stream(peer, chat_id)
        events = await read_until(stream, status_is("waiting"))
        await stream.aclose()
    assert [m.message.role for m in messages(events)] == ["user", "assistant"]
    assert [r.status for r in requests_of(sim, "stream")] == [429] * 4 + [101] + [429] * 3 + [101]
    assert [r.consecutive_failures for r in recorder.redials()] == [1, 2, 3, 4, 1, 2, 3, 4]


async def test_drop_after_uncoordinated_deltas_is_terminal(
    sim: Simulator, client: ChatClient
) -> None:
    sim.config.era_b.deltas_without_coordinates = True
    sim.config.delta_interval = 0.002
    chat = await client.create_chat(
        organization_id=str(sim.organization_id), content="/deltas 200 old"
    )
    await eventually(lambda: bool(sim.chat(chat.id).deltas))
    sim.faults.drop_streams(after_events=8, times=1)
    stream = await open_stream(client, chat.id)
    with pytest.raises(CoderStreamError) as terminal:
        async with asyncio.timeout(10):
            while True:
                await stream.next()
    await stream.aclose()
    assert "episode coordinates" in str(terminal.value)
    assert terminal.value.retryable is False


async def test_stream_uses_the_negotiated_prefix(sim: Simulator, client: ChatClient) -> None:
    chat_id = await idle_chat(sim)
    sim.config.era_b.experimental_routes_only = True
    sim.records.clear_requests()
    stream = await open_stream(client, chat_id)
    await read_until(stream, status_is("waiting"))
    await stream.aclose()
    # One probe under v2 (404), one under experimental, then the socket under experimental.
    assert [(r.route, r.path) for r in sim.records.requests] == [
        ("list_chats", V2),
        ("list_chats", EXP),
        ("stream", f"{EXP}/{chat_id}/stream"),
    ]


# -- frames the simulator never sends ----------------------------------------------------------------
def _status(status: str) -> dict[str, Any]:
    return {"type": "status", "chat_id": "c", "status": {"status": status}}


def _delta(seq: int, text: str, attempt: int = 1) -> dict[str, Any]:
    return {
        "type": "message_part",
        "chat_id": "c",
        "message_part": {
            "role": "assistant",
            "part": {"type": "text", "text": text},
            "history_version": 3,
            "generation_attempt": attempt,
            "seq": seq,
        },
    }


def _message(message_id: int, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "chat_id": "c",
        "message": {
            "id": message_id,
            "chat_id": "c",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
        },
    }


async def _serve_frames(*frames: str) -> Callable[[ServerConnection], Any]:
    async def script(connection: ServerConnection) -> None:
        for raw in frames:
            await connection.send(raw)
        await connection.wait_closed()

    return script


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("this is not json", "not valid JSON"),
        ('"a string"', "neither an array nor an object"),
        (json.dumps([{"type": "status"}]), "malformed 'status' event"),
        (json.dumps([{"no": "type"}]), "without a string 'type'"),
    ],
)
async def test_an_unparsable_frame_is_terminal(raw: str, reason: str) -> None:
    recorder = Recorder()
    script = await _serve_frames(frame(_status("running")), raw)
    async with (
        frame_server(script) as base_url,
        ChatClient(base_url=base_url, token="t", on_transport_event=recorder) as peer,
    ):
        stream = await open_stream(peer, "c")
        first = await asyncio.wait_for(stream.next(), 5)
        with pytest.raises(CoderStreamError) as unparsable:
            await asyncio.wait_for(stream.next(), 5)
        await stream.aclose()
    assert isinstance(first, StatusEvent)
    assert "unparsable frame" in str(unparsable.value)
    assert reason in str(unparsable.value)
    assert unparsable.value.chat_id == "c"
    assert len(recorder.dials()) == 1  # never redialed


async def test_in_socket_duplicates_are_dropped_and_unknown_events_pass(
    recorder: Recorder,
) -> None:
    frames = (
        frame(_delta(1, "He"), _delta(2, "ll")),
        frame(_delta(2, "ll"), _delta(3, "o")),  # seq 2 again
        json.dumps(_delta(4, "!")),  # a bare object is tolerated
        # Unknown event types are skipped whatever their fields look like.
        frame({"type": "something_new", "chat_id": "c", "extra": 1}, {"type": "x", "chat_id": 7}),
        frame(_message(10, "Hello!"), _message(10, "Hello!")),  # same revision twice
        frame(_message(10, "Hello, world!")),  # a revision: same id, new content
        frame(_delta(1, "x", attempt=2)),  # a new generation attempt starts at seq 1
        frame(_status("waiting")),
    )
    async with (
        frame_server(await _serve_frames(*frames)) as base_url,
        ChatClient(base_url=base_url, token="t", on_transport_event=recorder) as peer,
    ):
        stream = await open_stream(peer, "c")
        events = await read_until(stream, status_is("waiting"), timeout=5)
        await stream.aclose()
    assert [(d.message_part.generation_attempt, d.message_part.seq) for d in parts(events)] == [
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
        (2, 1),
    ]
    assert delta_text(parts(events)[:4]) == "Hello!"
    assert [m.message.text() for m in messages(events)] == ["Hello!", "Hello, world!"]
    assert [e.type for e in events if isinstance(e, OtherEvent)] == ["something_new", "x"]
    assert stream.cursor == 10
    verdicts = [(e.event_type, e.forwarded) for e in recorder.ws_events()]
    assert verdicts.count(("message_part", False)) == 1
    assert verdicts.count(("message", False)) == 1


async def test_the_stream_offers_no_compression() -> None:
    # Our frame server would accept permessage-deflate; coderd never does, so the
    # client must not ask for it.
    offered: list[str | None] = []

    async def script(connection: ServerConnection) -> None:
        assert connection.request is not None
        offered.append(connection.request.headers.get("Sec-WebSocket-Extensions"))
        await connection.send(frame(_status("waiting")))
        await connection.wait_closed()

    async with (
        frame_server(script) as base_url,
        ChatClient(base_url=base_url, token="t") as peer,
    ):
        stream = await open_stream(peer, "c")
        await read_until(stream, status_is("waiting"), timeout=5)
        await stream.aclose()
    assert offered == [None]
