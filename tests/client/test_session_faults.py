"""``ChatSession`` under every fault knob of the simulator, over real sockets."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest

from coder_chat.client.events import TransportEvent, WsOpen
from coder_chat.client.session import ChatSession
from coder_chat.client.story import STOPPED
from coder_chat.errors import CoderApiError, CoderChatError, CoderError, CoderStreamError
from coder_chat.simulator import Simulator

from .helpers import (
    Recorder,
    committed_assistant_text,
    eventually,
    idle_chat,
    requests_of,
    session_for,
    session_with_client,
)

V2 = "/api/v2/chats"
EXP = "/api/experimental/chats"

tool_runs: list[str] = []


async def lookup(city: str) -> str:
    """Look a city up."""
    tool_runs.append(city)
    return f"{city}: sunny"


@pytest.fixture(autouse=True)
def _reset_runs() -> None:
    tool_runs.clear()


def interrupts(sim: Simulator, chat_id: str) -> list[tuple[str, int]]:
    return [
        (r.status_before, r.http_status)
        for r in sim.records.interrupts
        if str(r.chat_id) == chat_id
    ]


# -- stream drops ------------------------------------------------------------------------------------
async def test_drops_mid_delta_neither_lose_nor_duplicate_text(sim: Simulator) -> None:
    sim.config.delta_interval = 0.002
    for budget in (40, 90, 150):
        sim.faults.drop_streams(after_events=budget, times=1)
    recorder = Recorder()
    session = session_for(sim, on_transport_event=recorder)
    result = await session.generate("/deltas 200 a long answer")
    await session.aclose()
    assert [result.text] == committed_assistant_text(sim, result.chat_id)
    assert result.text.startswith('You said: "a long answer"')
    assert len(result.steps) == 1
    assert len(recorder.dials()) == 4
    assert len({d.reader for d in recorder.dials()}) == 1
    forwarded = [e for e in recorder.ws_events() if e.event_type == "message_part" and e.forwarded]
    replayed = [
        e for e in recorder.ws_events() if e.event_type == "message_part" and not e.forwarded
    ]
    assert len(forwarded) <= 200  # each delta forwarded at most once
    assert replayed  # the redials replayed deltas, and they were suppressed


async def test_a_drop_during_a_client_tool_pause_redials_in_the_background(
    sim: Simulator,
) -> None:
    reopened = asyncio.Event()

    def watch(event: TransportEvent) -> None:
        recorder(event)
        if isinstance(event, WsOpen) and event.attempt == 2:
            reopened.set()

    async def gate(city: str) -> str:
        """Waits, while paused, until the stream has been redialed."""
        await asyncio.wait_for(reopened.wait(), 10)
        tool_runs.append(city)
        return "opened"

    recorder = Recorder()
    # The snapshot (3 events), the tool-call commit (2) and the pause (status +
    # action_required): the socket is cut right after the pause is announced.
    sim.faults.drop_streams(after_events=7, times=1)
    session = session_for(sim, tools=[gate], on_transport_event=watch)
    result = await session.generate('/sleep 0.2 /tool gate {"city": "Oslo"}')
    await session.aclose()
    assert tool_runs == ["Oslo"]
    assert len(requests_of(sim, "tool_results")) == 1  # the replayed pause was not answered again
    assert result.finish_reason == "stop"
    assert result.text == committed_assistant_text(sim, result.chat_id)[-1]
    assert len(recorder.dials()) == 2
    assert len({d.reader for d in recorder.dials()}) == 1
    # The cut came after the pause was announced: the redial resumes after the tool call.
    announced = next(
        i
        for i, e in enumerate(recorder.events)
        if e.type == "ws:event" and getattr(e, "event_type", "") == "action_required"
    )
    redial = recorder.events.index(recorder.dials()[1])
    assert announced < redial
    tool_call = next(m for m in sim.messages(result.chat_id) if m.role == "assistant")
    assert recorder.dials()[1].after_id == tool_call.id
    assert [s.finish_reason for s in recorder.settles()] == ["tool-calls", "stop"]


async def test_redial_budget_exhausted_on_a_fresh_chat(sim: Simulator) -> None:
    sim.faults.drop_streams(after_events=0, times=None)
    recorder = Recorder()
    session = session_for(sim, on_transport_event=recorder)
    with pytest.raises(CoderStreamError) as exhausted:
        await session.generate("hello")
    created = sim.chats()[0]
    assert exhausted.value.chat_id == str(created.id)
    assert exhausted.value.retryable is True  # no workspace, no MCP: a fresh retry is clean
    assert session.chat_id is None
    assert session.last_seen_message_id is None
    assert session.last_known_chat_id == str(created.id)
    assert len(recorder.dials()) == 5
    (settle,) = recorder.settles()
    assert settle.error_name == "CoderStreamError"

    # The stranded chat stays reachable for cleanup through last_known_chat_id.
    sim.faults.clear()
    await session.archive()
    await session.aclose()
    assert sim.chat(created.id).archived


@pytest.mark.parametrize("binding", ["workspace", "mcp"])
async def test_redial_budget_exhausted_with_effects_is_not_retryable(
    sim: Simulator, binding: str
) -> None:
    sim.faults.drop_streams(after_events=0, times=None)
    options: dict[str, Any] = (
        {"workspace_id": str(sim.workspace_id)}
        if binding == "workspace"
        else {"mcp_server_ids": [str(sim.mcp_server_id)]}
    )
    session = session_for(sim, **options)
    with pytest.raises(CoderStreamError) as exhausted:
        await session.generate("hello")
    await session.aclose()
    created = sim.chats()[0]
    assert exhausted.value.retryable is False
    assert exhausted.value.chat_id == str(created.id)
    assert session.chat_id is None  # discarded all the same
    assert session.last_known_chat_id == str(created.id)


async def test_redial_budget_exhausted_on_a_resumed_chat(sim: Simulator) -> None:
    chat_id = await idle_chat(sim)
    sim.faults.drop_streams(after_events=0, times=None)
    session = session_for(sim, chat_id=chat_id)
    with pytest.raises(CoderStreamError) as exhausted:
        await session.generate("again")
    await session.aclose()
    assert exhausted.value.retryable is False
    assert exhausted.value.chat_id == chat_id
    assert session.chat_id == chat_id  # a resumed chat is never discarded


async def test_a_4xx_upgrade_rejection_fails_the_turn_at_once(sim: Simulator) -> None:
    sim.faults.fail_next("stream", 403)
    recorder = Recorder()
    session = session_for(sim, on_transport_event=recorder)
    with pytest.raises(CoderApiError) as rejected:
        await session.generate("hi")
    await session.aclose()
    assert rejected.value.status == 403
    assert rejected.value.method == "GET"
    assert len(recorder.dials()) == 1
    assert session.chat_id is not None


async def test_a_429_upgrade_burst_is_absorbed(sim: Simulator) -> None:
    sim.faults.fail_next("stream", 429, 2)
    recorder = Recorder()
    session = session_for(sim, on_transport_event=recorder)
    result = await session.generate("hi")
    await session.aclose()
    assert result.text == 'You said: "hi"'
    assert [r.status for r in requests_of(sim, "stream")] == [429, 429, 101]
    assert [r.consecutive_failures for r in recorder.redials()] == [1, 2]


async def test_generation_retry_and_history_reset_mid_turn(sim: Simulator) -> None:
    chat_id = await idle_chat(sim, "old turn")
    sim.config.delta_interval = 0.003
    sim.faults.retry_generation(times=1)
    recorder = Recorder()
    session = session_for(sim, chat_id=chat_id, on_transport_event=recorder)
    turn = asyncio.create_task(session.generate("/deltas 80 new turn"))
    # Once the socket is open the server has subscribed it, so it will see the reset.
    await eventually(lambda: bool(sim.chat(chat_id).deltas) and bool(recorder.of("ws:open")))
    sim.reset_history(chat_id)  # the full history, old turn included, is sent again
    result = await turn
    await session.aclose()
    assert [result.text] == committed_assistant_text(sim, chat_id)[-1:]
    assert result.text.startswith('You said: "new turn"')
    own = [m.id for m in sim.messages(chat_id)][-1:]
    assert [s.message_id for s in result.steps] == own
    assert any(e.event_type == "history_reset" for e in recorder.ws_events())
    assert any(e.event_type == "retry" for e in recorder.ws_events())


# -- a lost action_required ---------------------------------------------------------------------------
async def test_a_withheld_action_required_is_recovered_from_history(sim: Simulator) -> None:
    sim.faults.withhold_action_required(times=1)
    recorder = Recorder()
    session = session_for(sim, tools=[lookup], action_grace=0.2, on_transport_event=recorder)
    result = await session.generate('/tool lookup {"city": "Quito"}')
    await session.aclose()
    assert tool_runs == ["Quito"]
    assert len(requests_of(sim, "tool_results")) == 1
    assert [r.status for r in requests_of(sim, "get_messages")] == [200]  # the recovery read
    assert not any(
        e.event_type == "action_required" for e in recorder.ws_events()
    )  # it never arrived
    assert result.text.startswith("lookup returned")
    assert [s.finish_reason for s in recorder.settles()] == ["tool-calls", "stop"]


async def test_recovery_with_two_pauses_in_one_turn(sim: Simulator) -> None:
    sim.faults.withhold_action_required(times=None)
    session = session_for(sim, tools=[lookup], action_grace=0.1)
    result = await session.generate('/tool lookup {"city": "A"} /tool lookup {"city": "B"}')
    await session.aclose()
    assert sorted(tool_runs) == ["A", "B"]
    assert len(requests_of(sim, "tool_results")) == 1  # both calls answered in one request
    assert result.finish_reason == "stop"


# -- REST faults ----------------------------------------------------------------------------------------
async def test_reads_in_a_turn_are_retried(sim: Simulator) -> None:
    chat_id = await idle_chat(sim)
    sim.records.clear_requests()
    sim.faults.fail_next("get_messages", 503, 2)
    session = session_with_client(sim, chat_id=chat_id)  # no cursor: the turn seeds it
    result = await session.generate("seeded")
    await session.aclose()
    assert result.text == 'You said: "seeded"'
    assert [r.status for r in requests_of(sim, "get_messages")] == [503, 503, 200]


@pytest.mark.parametrize("status", [503, 429])
async def test_a_rejected_send_surfaces_and_is_not_retried(sim: Simulator, status: int) -> None:
    chat_id = await idle_chat(sim)
    cursor = sim.messages(chat_id)[-1].id
    recorder = Recorder()
    session = session_for(
        sim, chat_id=chat_id, last_seen_message_id=cursor, on_transport_event=recorder
    )
    sim.records.clear_requests()
    sim.faults.fail_next("send_message", status)
    with pytest.raises(CoderApiError) as rejected:
        await session.generate("once")
    await session.aclose()
    assert rejected.value.status == status
    assert rejected.value.path == f"{V2}/{chat_id}/messages"
    assert [r.route for r in sim.records.requests] == ["send_message"]
    assert len(sim.messages(chat_id)) == 2
    assert (session.chat_id, session.last_seen_message_id) == (chat_id, cursor)
    (settle,) = recorder.settles()
    assert settle.error_name == "CoderApiError"


async def test_a_rejected_create_leaves_no_chat(sim: Simulator) -> None:
    sim.faults.fail_next("create_chat", 503)
    session = session_for(sim)
    with pytest.raises(CoderApiError) as rejected:
        await session.generate("first")
    await session.aclose()
    assert rejected.value.status == 503
    assert len(requests_of(sim, "create_chat")) == 1
    assert session.chat_id is None and session.last_known_chat_id is None
    assert sim.chats() == []


# -- timeouts, deadlines, cancellation --------------------------------------------------------------------
async def test_segment_timeout_raises_and_interrupts(sim: Simulator) -> None:
    recorder = Recorder()
    # The clock runs out in the middle of the turn, whatever the machine's load did to the
    # chat's creation before it.
    session = session_for(sim, request_timeout=2.0, on_transport_event=recorder)
    with pytest.raises(CoderChatError) as timed_out:
        await session.generate("/sleep 8 slow")
    await session.aclose()
    error = timed_out.value
    assert (error.kind, error.retryable) == ("timeout", True)
    assert error.chat_id == session.chat_id is not None
    assert error.chat_id is not None
    assert interrupts(sim, error.chat_id) == [("running", 200)]
    (settle,) = recorder.settles()
    assert settle.error_name == "CoderChatError" and settle.ending == "failure"
    await sim.wait_for_status(error.chat_id, "waiting")


async def test_redial_backoff_counts_against_the_segment_clock(sim: Simulator) -> None:
    sim.faults.drop_streams(after_events=0, times=None)
    recorder = Recorder()
    session = session_for(
        sim, request_timeout=3.0, redial_initial=30.0, on_transport_event=recorder
    )
    with pytest.raises(CoderChatError) as timed_out:
        await session.generate("/sleep 8 slow")
    await session.aclose()
    assert timed_out.value.kind == "timeout"
    assert len(recorder.dials()) == 1  # it was still backing off when the clock ran out
    assert [r.backoff for r in recorder.redials()] == [30.0]
    assert interrupts(sim, str(timed_out.value.chat_id)) == [("running", 200)]


async def test_a_stalled_send_counts_against_the_segment_clock(sim: Simulator) -> None:
    chat_id = await idle_chat(sim)
    sim.faults.hold("send_message", phase="before")
    session = session_for(sim, chat_id=chat_id, request_timeout=0.3)
    with pytest.raises(CoderChatError) as timed_out:
        await session.generate("stuck")
    await session.aclose()
    held = await sim.faults.wait_held("send_message")
    sim.faults.decide(held.id, "drop")
    assert timed_out.value.kind == "timeout"
    assert len(sim.messages(chat_id)) == 2  # nothing was committed


async def test_a_deadline_raises_timeout_error_and_interrupts(sim: Simulator) -> None:
    recorder = Recorder()
    session = session_for(sim, on_transport_event=recorder)
    with pytest.raises(TimeoutError) as expired:
        await session.generate("/sleep 5 slow", deadline=0.3)
    await session.aclose()
    assert not isinstance(expired.value, CoderChatError)
    assert session.chat_id is not None
    assert interrupts(sim, session.chat_id) == [("running", 200)]
    assert len(recorder.starts()) == len(recorder.settles()) == 1


async def test_a_stop_whose_check_before_acting_fails_sends_nothing_and_says_so(
    sim: Simulator,
) -> None:
    """The check before acting (the durable layer's fence, reading its store) fails when
    the turn must be stopped: no interrupt leaves, and the session says the stop was
    undelivered, so that the attempt is not taken for one the stop may have cut."""

    async def store_out_of_reach(action: str) -> None:
        if action == "interrupt":
            raise CoderError("the store is out of reach")

    await stopped_unsent(sim, session_for(sim, before_action=store_out_of_reach))


async def stopped_unsent(sim: Simulator, session: ChatSession) -> None:
    """A slow turn's deadline passes, and a check before its interrupt refuses it: no
    interrupt left, and the session says the stop was undelivered."""
    with pytest.raises(TimeoutError):
        await session.generate("/sleep 5 slow", deadline=0.3)
    await session.aclose()
    assert session.chat_id is not None
    assert interrupts(sim, session.chat_id) == []
    assert sim.chat(session.chat_id).status == "running"  # left to whoever stops it
    assert session.last_stop == "undelivered" and session.last_stop_at is None


async def test_a_stop_that_cannot_be_recorded_first_is_not_sent(sim: Simulator) -> None:
    """A durable step journals a stop before its interrupt leaves (fleet lab 24/3). When
    that record cannot be written, no interrupt is sent: the run goes on, and the
    session says the stop was undelivered. When it can, it is written with the moment
    the interrupt was sent, before it."""
    recorded: list[tuple[str, datetime]] = []

    async def store_out_of_reach(chat_id: str, at: datetime) -> None:
        raise CoderError("the store is out of reach")

    async def record(chat_id: str, at: datetime) -> None:
        recorded.append((chat_id, at))

    await stopped_unsent(sim, session_for(sim, before_interrupt=store_out_of_reach))

    recording = session_for(sim, before_interrupt=record)
    with pytest.raises(TimeoutError):
        await recording.generate("/sleep 5 slow", deadline=0.3)
    await recording.aclose()
    assert recording.chat_id is not None
    assert interrupts(sim, recording.chat_id) == [("running", 200)]
    assert recorded == [(recording.chat_id, recording.last_stop_at)]


async def test_cancellation_reraises_and_interrupts(sim: Simulator) -> None:
    recorder = Recorder()
    session = session_for(sim, on_transport_event=recorder)
    turn = asyncio.create_task(session.generate("/sleep 5 slow"))
    await eventually(lambda: bool(recorder.of("ws:open")))
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    await session.aclose()
    assert session.chat_id is not None
    assert interrupts(sim, session.chat_id) == [("running", 200)]
    assert len(recorder.starts()) == len(recorder.settles()) == 1


async def test_request_timeout_bounds_each_segment_not_the_turn(sim: Simulator) -> None:
    """A client tool runs between segments: its time is not on any segment's clock."""

    async def slow(city: str) -> str:
        """Takes longer than a whole segment may."""
        await asyncio.sleep(2.5)
        tool_runs.append(city)
        return "done"

    recorder = Recorder()
    session = session_for(sim, tools=[slow], request_timeout=2.0, on_transport_event=recorder)
    result = await session.generate('/tool slow {"city": "Lund"}')
    await session.aclose()
    assert tool_runs == ["Lund"]
    assert result.finish_reason == "stop"
    assert [s.ending for s in recorder.settles()] == ["clean", "clean"]


async def test_a_slow_interrupt_and_the_next_prompt(sim: Simulator) -> None:
    """The interrupt answers at once; the next prompt queues behind the wind-down."""
    sim.config.interrupt_winddown = 0.4
    sim.config.delta_interval = 0.005
    session = session_for(sim, request_timeout=1.5)
    with pytest.raises(CoderChatError):
        await session.generate("/deltas 1200 interrupted answer")
    assert session.chat_id is not None
    chat_id = session.chat_id
    assert sim.chat(chat_id).status == "interrupting"  # still winding down

    session.options = replace(session.options, request_timeout=10.0)
    result = await session.generate("next")
    await session.aclose()
    assert result.text == 'You said: "next"'
    partial, final = committed_assistant_text(sim, chat_id)
    assert partial and 'You said: "interrupted answer"'.startswith(partial[:20])
    assert final == result.text
    assert [s.text for s in result.steps] == [result.text]


# -- queued prompts --------------------------------------------------------------------------------------
async def test_a_prompt_queued_behind_a_live_run_gets_only_its_own_output(sim: Simulator) -> None:
    sim.config.delta_interval = 0.005
    live_events = Recorder()
    live = session_for(sim, on_transport_event=live_events)
    first = asyncio.create_task(live.generate("/deltas 60 first"))
    await eventually(lambda: live.chat_id is not None and bool(sim.chat(live.chat_id).deltas))
    assert live.chat_id is not None
    queued = session_for(sim, chat_id=live.chat_id)
    second = await queued.generate("second")
    first_result = await first
    await live.aclose()
    await queued.aclose()

    assert first_result.finish_reason == "stop"
    # The live turn never saw a terminal status: it settled at the promotion boundary.
    (settle,) = live_events.settles()
    assert (settle.status, settle.finish_reason) == ("running", "stop")
    assert first_result.text.startswith('You said: "first"')
    assert second.text == 'You said: "second"'
    assert second.finish_reason == "stop"
    ids = [m.id for m in sim.messages(live.chat_id)]
    assert [s.message_id for s in first_result.steps] == [ids[1]]
    assert [s.message_id for s in second.steps] == [ids[3]]
    reported = sim.messages(live.chat_id)[3].usage or {}
    assert second.usage.total_tokens == reported["total_tokens"] + reported["cache_read_tokens"]
    # Neither turn interrupted anything.
    assert sim.records.interrupts == []


async def test_a_timed_out_queued_prompt_is_withdrawn(sim: Simulator) -> None:
    (busy,) = sim.seed(1, status="running")  # a run that never ends by itself
    chat_id = str(busy)
    # Long enough for the send's answer to come back on a loaded machine: the prompt is
    # known queued, so it is withdrawn (a send whose answer never came is another case).
    session = session_for(sim, chat_id=chat_id, request_timeout=2.0)
    with pytest.raises(CoderChatError) as timed_out:
        await session.generate("never mind")
    await session.aclose()
    assert timed_out.value.kind == "timeout"
    assert sim.chat(chat_id).queue == []  # withdrawn
    assert [r.status for r in requests_of(sim, "delete_queued")] == [204]
    assert sim.records.interrupts == []  # the live run it queued behind was left alone
    assert sim.chat(chat_id).status == "running"


async def test_a_timed_out_send_whose_answer_never_came_withdraws_only_its_own_prompt(
    sim: Simulator,
) -> None:
    (busy,) = sim.seed(1, status="running")  # someone else's run, still going
    chat_id = str(busy)
    sim.faults.hold("send_message", phase="after")  # queued, and the answer never comes
    told: list[str] = []
    session = session_for(sim, chat_id=chat_id, request_timeout=1.5, story=told.append)
    with pytest.raises(CoderChatError) as timed_out:
        await session.generate("never mind")
    await session.aclose()
    sim.faults.clear()
    assert timed_out.value.kind == "timeout"
    assert session.last_stop == "withdrawn"
    assert told == [STOPPED["withdrawn"]]  # its task-run log says so (nothing was sent)
    assert sim.chat(chat_id).queue == []  # found in the queue by its text, and withdrawn
    assert sim.records.interrupts == []  # the run it queued behind was left alone
    assert sim.chat(chat_id).status == "running"


async def test_a_timed_out_send_that_never_arrived_stops_nothing(sim: Simulator) -> None:
    (busy,) = sim.seed(1, status="running")
    chat_id = str(busy)
    sim.faults.hold("send_message", phase="before")  # held before it had any effect
    told: list[str] = []
    session = session_for(sim, chat_id=chat_id, request_timeout=1.5, story=told.append)
    with pytest.raises(CoderChatError):
        await session.generate("never mind")
    await session.aclose()
    assert session.last_stop == "undelivered"
    assert told == [STOPPED["absent"]]
    assert sim.records.interrupts == []
    assert sim.chat(chat_id).status == "running"
    sim.faults.clear()


async def test_a_stop_that_cannot_read_the_chat_stops_nothing_and_says_so(
    sim: Simulator,
) -> None:
    (busy,) = sim.seed(1, status="running")
    chat_id = str(busy)
    newest = sim.messages(chat_id)[-1].id
    sim.faults.hold("send_message", phase="after")
    sim.faults.fail_next("get_messages", 500, count=50)  # where the prompt went is unknown
    session = session_for(sim, chat_id=chat_id, last_seen_message_id=newest, request_timeout=1.5)
    with pytest.raises(CoderChatError):
        await session.generate("never mind")
    await session.aclose()
    sim.faults.clear()
    # Only reads were tried: no interrupt left, so the attempt was not cut short by it.
    assert session.last_stop == "undelivered"
    assert sim.records.interrupts == []


async def test_a_timed_out_send_admitted_to_an_idle_chat_interrupts_its_run(
    sim: Simulator,
) -> None:
    session = session_for(sim)
    await session.generate("hello")
    assert session.chat_id is not None
    sim.faults.hold("send_message", phase="after")  # admitted and running; no answer
    session.options = replace(session.options, request_timeout=1.5)
    with pytest.raises(CoderChatError):
        await session.generate("/sleep 30")
    await session.aclose()
    sim.faults.clear()
    assert session.last_stop == "interrupted"
    assert len(sim.records.interrupts) == 1


# -- era-B and route toggles ------------------------------------------------------------------------------
async def test_a_whole_turn_on_experimental_routes_only(sim: Simulator) -> None:
    sim.config.era_b.experimental_routes_only = True
    session = session_for(sim, tools=[lookup])
    result = await session.generate('/tool lookup {"city": "Kyiv"}')
    await session.aclose()
    assert tool_runs == ["Kyiv"]
    assert result.text.startswith("lookup returned")
    paths = [r.path for r in sim.records.requests]
    assert [p for p in paths if p.startswith(V2)] == [V2]  # the first create only
    assert all(p.startswith(EXP) for p in paths[1:])


@pytest.mark.parametrize("toggle", ["pending_status", "error_before_status"])
async def test_era_b_orderings(sim: Simulator, toggle: str) -> None:
    setattr(sim.config.era_b, toggle, True)
    session = session_for(sim)
    ok = await session.generate("fine")
    with pytest.raises(CoderChatError) as failed:
        await session.generate("/fail retryable")
    await session.aclose()
    assert ok.text == 'You said: "fine"'
    assert (failed.value.kind, failed.value.retryable) == ("overloaded", True)


async def test_a_deadline_on_a_queued_prompt_withdraws_it(sim: Simulator) -> None:
    (busy,) = sim.seed(1, status="running")  # another worker's run, still going
    chat_id = str(busy)
    session = session_for(sim, chat_id=chat_id)
    with pytest.raises(TimeoutError):
        await session.generate("never mind", deadline=0.3)
    await session.aclose()
    assert sim.chat(chat_id).queue == []  # withdrawn, not left to run unattended
    assert sim.records.interrupts == []  # and the run it queued behind was not stopped
    assert sim.chat(chat_id).status == "running"


async def test_a_deadline_before_the_prompt_left_stops_nothing(sim: Simulator) -> None:
    (busy,) = sim.seed(1, status="running")  # someone else's run
    chat_id = str(busy)

    async def slow_check(action: str) -> None:
        if action == "send":
            await asyncio.sleep(2.0)  # the deadline comes first: the send never leaves

    told: list[str] = []
    session = session_for(sim, chat_id=chat_id, before_action=slow_check, story=told.append)
    with pytest.raises(TimeoutError):
        await session.generate("never mind", deadline=0.3)
    await session.aclose()
    assert session.last_stop == "undelivered" and told == [STOPPED["unsent"]]
    assert sim.records.interrupts == [] and sim.chat(chat_id).status == "running"


async def test_cancelling_a_queued_prompt_withdraws_it(sim: Simulator) -> None:
    (busy,) = sim.seed(1, status="running")
    chat_id = str(busy)
    recorder = Recorder()
    session = session_for(sim, chat_id=chat_id, on_transport_event=recorder)
    turn = asyncio.create_task(session.generate("never mind"))
    # Once the stream dials, the send's answer (with the queued prompt's id) is in hand.
    await eventually(lambda: bool(recorder.dials()))
    assert len(sim.chat(chat_id).queue) == 1
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    await session.aclose()
    assert sim.chat(chat_id).queue == []
    assert sim.records.interrupts == []
