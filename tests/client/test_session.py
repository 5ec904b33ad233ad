"""``ChatSession`` turns against the simulator over real sockets: the normal paths."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest
from pydantic import BaseModel

from coder_chat import ChatClient, ChatOptions, ChatSession, TurnResult
from coder_chat.client.events import SegmentSettle, TransportEvent
from coder_chat.errors import CoderApiError, CoderChatError, CoderConfigError, CoderError
from coder_chat.simulator import Simulator

from .helpers import (
    Recorder,
    client_for,
    committed_assistant_text,
    eventually,
    idle_chat,
    requests_of,
    session_for,
    session_with_client,
    token_free,
)

# -- client tools (module level: their annotations are resolved by name) -------------------------
calls: list[dict[str, Any]] = []


async def lookup(city: str, days: int = 1, idempotency_key: str = "") -> dict[str, Any]:
    """Look up the weather for a city."""
    calls.append({"city": city, "days": days, "idempotency_key": idempotency_key})
    return {"city": city, "forecast": "sunny", "days": days}


async def explode(reason: str) -> str:
    """A tool that always fails."""
    raise RuntimeError(f"boom: {reason}")


class Answer(BaseModel):
    answer: int
    why: str


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    calls.clear()


# -- construction -----------------------------------------------------------------------------------
async def test_construction_does_no_io(sim: Simulator) -> None:
    chat_id = await idle_chat(sim)
    sim.records.clear_requests()
    session = session_for(sim, chat_id=chat_id, last_seen_message_id=3, tools=[lookup])
    nowhere = ChatSession.connect("http://127.0.0.1:9", "t", "o", chat_id="not-a-chat")
    await asyncio.sleep(0.01)
    assert sim.records.requests == []
    assert (session.chat_id, session.last_known_chat_id, session.last_seen_message_id) == (
        chat_id,
        chat_id,
        3,
    )
    assert nowhere.chat_id == "not-a-chat"  # a bad chat id fails the turn, not the constructor
    await session.aclose()
    await nowhere.aclose()


@pytest.mark.parametrize("cursor", [0, -1, True, False, "5", 1.5])
def test_a_cursor_that_is_not_a_positive_integer_is_rejected(cursor: Any) -> None:
    with pytest.raises(CoderConfigError, match="positive integer"):
        ChatSession.connect("http://x", "t", "o", chat_id="c", last_seen_message_id=cursor)


def test_a_cursor_without_its_chat_id_is_rejected() -> None:
    with pytest.raises(CoderConfigError, match="chat_id") as caught:
        ChatSession.connect("http://x", "t", "o", last_seen_message_id=5)
    assert isinstance(caught.value, ValueError)


async def test_defaults_follow_the_reference_sdk() -> None:
    session = ChatSession.connect("http://x", "t", "o")
    options = session.options
    assert (options.request_timeout, options.redial_initial, options.redial_max_failures) == (
        300.0,
        1.0,
        5,
    )
    assert options.action_grace == 2.0
    assert (options.archive_retry_interval, options.archive_window) == (1.0, 15.0)
    assert (session.chat_id, session.last_known_chat_id, session.last_seen_message_id) == (
        None,
        None,
        None,
    )
    await session.aclose()


async def test_the_token_stays_out_of_every_repr() -> None:
    session = ChatSession.connect("http://x", "secret-token-42", "o", chat_id="c")
    shown = " ".join(map(repr, (session, session.options, session.hooks, session.client)))
    assert "secret-token-42" not in shown
    assert "chat_id='c'" in shown
    await session.aclose()


def test_options_and_pointer_are_keyword_only() -> None:
    client = ChatClient(base_url="http://x", token="t")
    with pytest.raises(TypeError):
        ChatSession(client, "o", "chat-1")  # type: ignore[call-arg]


async def test_a_session_never_closes_a_client_handed_in(sim: Simulator) -> None:
    async with client_for(sim) as client:
        session = ChatSession(client, str(sim.organization_id))
        await session.generate("hello")
        await session.aclose()
        again = ChatSession(client, str(sim.organization_id))
        assert (await again.generate("still open")).text == 'You said: "still open"'


def test_other_arguments_are_checked_at_once() -> None:
    with pytest.raises(CoderConfigError):
        ChatSession.connect("http://x", "t", "")
    with pytest.raises(CoderConfigError):
        ChatOptions(request_timeout=0)
    with pytest.raises(CoderConfigError):
        ChatOptions(redial_max_failures=0)

    def not_async(city: str) -> str:
        return city

    with pytest.raises(CoderConfigError, match="async"):
        ChatSession.connect("http://x", "t", "o", tools=[not_async])  # type: ignore[list-item]


# -- first turn and resumed turns -------------------------------------------------------------------
async def test_first_turn_creates_the_chat(sim: Simulator) -> None:
    session = session_for(
        sim, tools=[lookup], labels={"workflow": "wf-1"}, system_prompt="Be terse."
    )
    result = await session.generate("hello there")
    await session.aclose()

    assert isinstance(result, TurnResult)
    assert result.text == 'You said: "hello there"'
    assert result.finish_reason == "stop"
    chat = sim.chat(result.chat_id)
    assert chat.labels == {"workflow": "wf-1"}
    assert chat.system_prompt == "Be terse."
    assert session.chat_id == session.last_known_chat_id == result.chat_id
    assert (
        result.last_seen_message_id
        == session.last_seen_message_id
        == sim.messages(result.chat_id)[-1].id
    )

    (declared,) = chat.dynamic_tools
    assert declared["name"] == "lookup"
    assert declared["description"] == "Look up the weather for a city."
    schema = declared["input_schema"]
    assert set(schema["properties"]) == {"city", "days"}  # idempotency_key is not the model's
    assert schema["properties"]["city"]["type"] == "string"
    assert schema["properties"]["days"]["type"] == "integer"
    assert schema["required"] == ["city"]

    (_user, assistant) = sim.messages(result.chat_id)
    assert [s.message_id for s in result.steps] == [assistant.id]
    assert result.steps[0].text == assistant.text()
    reported = assistant.usage or {}
    # chatd's input leaves the cache reads out; the turn's counts them in, as the SDK does.
    assert result.usage.input_tokens == reported["input_tokens"] + reported["cache_read_tokens"]
    assert result.usage.output_tokens == reported["output_tokens"]
    assert result.output is None
    assert [r.route for r in sim.records.requests if r.route != "stream"] == ["create_chat"]


async def test_next_turn_resumes_with_only_its_own_output(sim: Simulator) -> None:
    session = session_for(sim)
    first = await session.generate("one")
    sim.records.clear_requests()
    second = await session.generate("two")
    await session.aclose()

    assert second.chat_id == first.chat_id
    assert second.text == 'You said: "two"'
    assert len(second.steps) == 1
    assert second.usage.output_tokens == 3
    # The cursor was known: no seeding read, one send, one stream.
    assert [r.route for r in sim.records.requests] == ["send_message", "stream"]
    assert second.last_seen_message_id == sim.messages(first.chat_id)[-1].id
    assert session.last_seen_message_id == second.last_seen_message_id


async def test_resume_elsewhere_seeds_the_cursor_with_one_read(sim: Simulator) -> None:
    chat_id = await idle_chat(sim, "earlier work")
    sim.records.clear_requests()
    recorder = Recorder()
    session = session_for(sim, chat_id=chat_id, on_transport_event=recorder)
    result = await session.generate("continue")
    await session.aclose()
    assert result.text == 'You said: "continue"'
    assert [r.route for r in sim.records.requests] == ["get_messages", "send_message", "stream"]
    earlier = sim.messages(chat_id)[1]
    assert recorder.dials()[0].after_id == earlier.id
    assert [s.text for s in result.steps] == ['You said: "continue"']


async def test_resume_with_a_checkpointed_cursor_skips_the_read(sim: Simulator) -> None:
    chat_id = await idle_chat(sim, "earlier work")
    cursor = sim.messages(chat_id)[-1].id
    sim.records.clear_requests()
    session = session_for(sim, chat_id=chat_id, last_seen_message_id=cursor)
    result = await session.generate("next")
    await session.aclose()
    assert result.text == 'You said: "next"'
    assert "get_messages" not in [r.route for r in sim.records.requests]


async def test_a_turn_on_an_unknown_chat_fails_the_turn(sim: Simulator) -> None:
    session = session_for(sim, chat_id=str(uuid.uuid4()))
    with pytest.raises(CoderApiError) as missing:
        await session.generate("hi")
    await session.aclose()
    assert missing.value.status == 404


# -- client tools ---------------------------------------------------------------------------------------
async def test_client_tool_runs_and_the_turn_continues_on_one_stream(sim: Simulator) -> None:
    recorder = Recorder()
    session = session_for(sim, tools=[lookup], on_transport_event=recorder)
    result = await session.generate('check /tool lookup {"city": "Oslo", "days": 3}')
    await session.aclose()

    (record,) = sim.records.tool_results
    assert calls == [
        {
            "city": "Oslo",
            "days": 3,
            "idempotency_key": f"{sim.organization_id}/{result.chat_id}/{record.tool_call_id}",
        }
    ]
    assert record.output == {"city": "Oslo", "forecast": "sunny", "days": 3}
    assert not record.is_error
    assert result.finish_reason == "stop"
    # The final step's text only: what follows the client-tool call.
    assert result.text == committed_assistant_text(sim, result.chat_id)[-1]
    assert result.text.startswith("lookup returned")
    assert [len(s.tool_calls) for s in result.steps] == [1, 0]
    (call,) = result.steps[0].tool_calls
    assert (call.tool_name, call.args, call.output, call.is_error) == (
        "lookup",
        {"city": "Oslo", "days": 3},
        record.output,
        False,
    )
    # Two segments (prompt, tool results) on one socket.
    assert len(recorder.starts()) == 2
    assert len(recorder.dials()) == 1
    assert [s.finish_reason for s in recorder.settles()] == ["tool-calls", "stop"]
    assert [s.status for s in recorder.settles()] == ["requires_action", "waiting"]
    assert recorder.ops() == ["create_chat", "submit_tool_results"]
    usages = [m.usage for m in sim.messages(result.chat_id) if m.usage is not None]
    assert result.usage.output_tokens == sum(u["output_tokens"] for u in usages)


@pytest.mark.parametrize(
    "args",
    ['{"city": 5}', "{}", '{"city": "Oslo", "country": "NO"}'],
    ids=["type", "missing", "extra"],
)
async def test_invalid_tool_arguments_become_an_error_result(sim: Simulator, args: str) -> None:
    session = session_for(sim, tools=[lookup])
    result = await session.generate(f"/tool lookup {args}")
    await session.aclose()
    assert calls == []  # the function never ran
    (record,) = sim.records.tool_results
    assert record.is_error
    assert str(record.output).startswith("invalid arguments")
    # The model saw the failure and answered anyway: the turn ends normally.
    assert result.finish_reason == "stop"
    assert result.text.startswith("lookup failed")
    assert result.steps[0].tool_calls[0].is_error


async def test_a_tool_that_raises_reports_an_error_result(sim: Simulator) -> None:
    session = session_for(sim, tools=[explode])
    result = await session.generate('/tool explode {"reason": "disk full"}')
    await session.aclose()
    (record,) = sim.records.tool_results
    assert record.is_error and record.output == "RuntimeError: boom: disk full"
    assert result.text.startswith("explode failed")


async def test_a_call_to_a_tool_this_session_lacks_is_answered_with_an_error(
    sim: Simulator,
) -> None:
    creator = session_for(sim, tools=[lookup])
    first = await creator.generate("declare the tool")
    await creator.aclose()
    # A later step that forgot to re-supply its tools.
    session = session_for(sim, chat_id=first.chat_id)
    result = await session.generate('/tool lookup {"city": "Oslo"}')
    await session.aclose()
    assert calls == []
    (record,) = sim.records.tool_results
    assert record.is_error and "not available" in str(record.output)
    assert result.finish_reason == "stop"


async def test_server_tools_run_on_the_server(sim: Simulator) -> None:
    session = session_for(sim, tools=[lookup])
    result = await session.generate('/server-tool deploy {"env": "prod"}')
    await session.aclose()
    (effect,) = sim.records.effects
    assert (effect.tool_name, effect.args) == ("deploy", {"env": "prod"})
    assert calls == []
    assert sim.records.tool_results == []
    (call,) = [c for s in result.steps for c in s.tool_calls]
    assert call.tool_name == "deploy" and call.output["ok"] is True
    # Narration before a server tool call stays in the text (only client tools cut it).
    assert result.text.startswith("Calling deploy.")
    assert result.text.endswith('You said: ""')


# -- structured output -----------------------------------------------------------------------------------
async def test_structured_output_returns_the_validated_object(sim: Simulator) -> None:
    session = session_for(sim)
    result = await session.generate('/json {"answer": 42, "why": "it is"}', output_type=Answer)
    await session.aclose()
    assert result.output == Answer(answer=42, why="it is")
    (declared,) = sim.chat(result.chat_id).dynamic_tools
    assert declared["name"] == "structured_output"
    assert set(declared["input_schema"]["properties"]) == {"answer", "why"}
    (record,) = sim.records.tool_results
    assert not record.is_error


async def test_structured_output_that_does_not_validate_fails_the_turn(sim: Simulator) -> None:
    session = session_for(sim)
    with pytest.raises(CoderChatError) as missing:
        await session.generate('/json {"answer": "many"}', output_type=Answer)
    await session.aclose()
    assert missing.value.kind == "structured_output_missing"
    assert not missing.value.retryable
    (record,) = sim.records.tool_results
    assert record.is_error  # the model was told its answer did not fit the schema


# -- turns that end in error --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "kind", "retryable", "status_code"),
    [("retryable", "overloaded", True, 529), ("fatal", "config", False, 400)],
)
async def test_a_turn_ending_in_error_raises_the_servers_error(
    sim: Simulator, mode: str, kind: str, retryable: bool, status_code: int
) -> None:
    recorder = Recorder()
    session = session_for(sim, on_transport_event=recorder)
    with pytest.raises(CoderChatError) as failed:
        await session.generate(f"/fail {mode}")
    await session.aclose()
    error = failed.value
    assert (error.kind, error.retryable, error.status_code, error.provider) == (
        kind,
        retryable,
        status_code,
        "simulator",
    )
    assert error.chat_id == session.chat_id is not None
    assert error.detail == f"simulated /fail {mode}"
    (settle,) = recorder.settles()
    assert (settle.status, settle.error_name) == ("error", "CoderChatError")
    assert settle.ending == "failure"
    # The chat survives a failed turn; the next turn on it works.
    async with session_for(sim, chat_id=session.chat_id) as resumed:
        again = await resumed.generate("retry")
    assert again.text == 'You said: "retry"'


# -- single flight, prompts -------------------------------------------------------------------------------
async def test_one_turn_at_a_time(sim: Simulator) -> None:
    sim.config.delta_interval = 0.005
    session = session_for(sim)
    first = asyncio.create_task(session.generate("/deltas 40 slow"))
    await eventually(lambda: session.chat_id is not None)
    with pytest.raises(CoderError, match="already running"):
        await session.generate("second")
    result = await first
    await session.aclose()
    assert result.text.startswith('You said: "slow"')


async def test_an_empty_prompt_is_rejected_before_any_request(sim: Simulator) -> None:
    session = session_for(sim)
    with pytest.raises(CoderConfigError):
        await session.generate("   ")
    await session.aclose()
    assert sim.records.requests == []


# -- interrupt, archive, async with ------------------------------------------------------------------------
async def test_interrupt(sim: Simulator) -> None:
    (busy,) = sim.seed(1, status="running")
    session = session_for(sim, chat_id=str(busy))
    await session.interrupt()
    assert sim.chat(busy).status == "interrupting"
    await sim.wait_for_status(busy, "waiting")
    with pytest.raises(CoderApiError) as idle:
        await session.interrupt()
    assert idle.value.status == 409
    await session_for(sim).interrupt()  # no chat yet: nothing to do
    await session.aclose()
    assert [r.http_status for r in sim.records.interrupts] == [200, 409]


async def test_archive_is_idempotent_and_keeps_the_chat_id(sim: Simulator) -> None:
    session = session_for(sim)
    result = await session.generate("done")
    await session.archive()
    await session.archive()  # already archived: done
    assert sim.chat(result.chat_id).archived
    assert session.chat_id == result.chat_id
    assert [a.archived for a in sim.records.archives] == [True]
    assert [r.status for r in requests_of(sim, "update_chat")] == [204, 400]

    with pytest.raises(CoderApiError) as archived:
        await session.generate("more")
    await session.aclose()
    assert archived.value.status == 400
    assert archived.value.message == "Cannot send messages to an archived chat."


async def test_archive_retries_409_while_the_chat_runs(sim: Simulator) -> None:
    (busy,) = sim.seed(1, status="running")
    session = session_for(sim, chat_id=str(busy))

    async def finish_later() -> None:
        await eventually(lambda: len(requests_of(sim, "update_chat")) >= 2)
        sim.engine.interrupt(sim.chat(busy))

    stopper = asyncio.create_task(finish_later())
    await session.archive()
    await stopper
    await session.aclose()
    statuses = [r.status for r in requests_of(sim, "update_chat")]
    assert statuses[-1] == 204 and set(statuses[:-1]) == {409} and len(statuses) >= 3
    assert sim.chat(busy).archived


async def test_archive_gives_up_after_its_window(sim: Simulator) -> None:
    (stuck,) = sim.seed(1, status="running")
    session = session_for(sim, chat_id=str(stuck), archive_window=0.2)
    with pytest.raises(CoderApiError) as busy:
        await session.archive()
    await session.aclose()
    assert busy.value.status == 409
    assert len(requests_of(sim, "update_chat")) >= 2
    assert not sim.chat(stuck).archived


async def test_an_archive_retry_checks_again_before_it_leaves(sim: Simulator) -> None:
    (busy,) = sim.seed(1, status="running")  # every attempt is refused 409 while it runs
    checks: list[str] = []

    async def fenced_after_the_first(action: str) -> None:
        checks.append(action)
        if len(checks) > 1:
            raise CoderError("a newer epoch holds the workflow")

    session = session_for(sim, chat_id=str(busy), before_action=fenced_after_the_first)
    with pytest.raises(CoderError, match="newer epoch"):
        await session.archive()
    await session.aclose()
    assert checks == ["archive", "archive"]
    assert len(requests_of(sim, "update_chat")) == 1  # the retry never left
    assert not sim.chat(busy).archived


async def test_async_with_archives_on_exit(sim: Simulator) -> None:
    async with session_for(sim) as session:
        result = await session.generate("one-off")
    assert sim.chat(result.chat_id).archived
    # The exit interrupted first: on a settled chat that is a 409, which is ignored.
    assert [r.http_status for r in sim.records.interrupts] == [409]


async def test_async_with_stops_a_running_chat_before_archiving(sim: Simulator) -> None:
    (busy,) = sim.seed(1, status="running")
    async with session_for(sim, chat_id=str(busy)):
        pass
    assert [r.http_status for r in sim.records.interrupts] == [200]
    assert sim.chat(busy).archived
    assert 409 in [r.status for r in requests_of(sim, "update_chat")]


# -- transport events -----------------------------------------------------------------------------------------
async def test_transport_events_of_a_turn(sim: Simulator) -> None:
    recorder = Recorder()
    session = session_for(sim, tools=[lookup], on_transport_event=recorder)
    result = await session.generate('/tool lookup {"city": "Rome"}')
    await session.aclose()
    kinds = [e.type for e in recorder.events]
    assert kinds[0] == "segment:start"
    assert kinds[-1] == "segment:settle"
    for kind in ("http:request", "http:response", "ws:dial", "ws:open", "ws:event"):
        assert kind in kinds, kind
    assert {e.chat_id for e in recorder.dials()} == {result.chat_id}
    forwarded = [e for e in recorder.ws_events() if e.forwarded]
    assert {e.event_type for e in forwarded} >= {"message", "status", "action_required"}
    assert [s.segment for s in recorder.starts()] == [s.segment for s in recorder.settles()]
    assert [s.ending for s in recorder.settles()] == ["clean", "clean"]


async def test_a_raising_callback_cannot_disturb_the_turn(
    sim: Simulator, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[TransportEvent] = []

    def hostile(event: TransportEvent) -> None:
        seen.append(event)
        raise RuntimeError("observer bug")

    session = session_for(sim, tools=[lookup], on_transport_event=hostile)
    with caplog.at_level(logging.DEBUG, logger="coder_chat.transport"):
        result = await session.generate('/tool lookup {"city": "Lima"}')
        second = await session.generate("again")
    await session.aclose()
    assert result.finish_reason == second.finish_reason == "stop"
    starts = [e for e in seen if e.type == "segment:start"]
    settles = [e for e in seen if isinstance(e, SegmentSettle)]
    assert len(starts) == len(settles) == 3
    assert [e.segment for e in starts] == [e.segment for e in settles] == [1, 2, 3]
    assert len(seen) > 10  # it kept being called after raising


async def test_the_token_never_shows(sim: Simulator, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    recorder = Recorder()
    session = session_with_client(sim, recorder, tools=[lookup])
    result = await session.generate('/tool lookup {"city": "Bern"}')
    with pytest.raises(CoderChatError) as failed:
        await session.generate("/fail fatal")
    sim.faults.fail_next("send_message", 503)
    with pytest.raises(CoderApiError) as rejected:
        await session.generate("x")
    await session.aclose()
    things: list[object] = [
        session,
        session.client,
        result,
        result.model_dump_json(),
        failed.value,
        rejected.value,
        *recorder.events,
    ]
    assert token_free(sim.token, things) == []
    assert all(sim.token not in r.getMessage() for r in caplog.records)
