"""Pure unit tests: frames, de-duplication, the turn translator, transcripts, retry, tools."""

from __future__ import annotations

import asyncio
import itertools
import json
import pickle
from typing import Any

import pytest
from pydantic import BaseModel

from coder_chat import errors
from coder_chat.client.results import build_steps
from coder_chat.client.tools import (
    ClientTool,
    ToolArgumentsError,
    ToolCallContext,
    client_tool,
    structured_output_tool,
    tool_output,
)
from coder_chat.durable.records import Fence, FencedOut, PromptChanged
from coder_chat.errors import (
    CoderConfigError,
    CoderError,
    CoderStoreError,
    CoderToolError,
)
from coder_chat.protocol.dedupe import StreamLedger
from coder_chat.protocol.frames import FrameError, parse_frame
from coder_chat.protocol.models import (
    ActionRequiredEvent,
    AnyEvent,
    ChatMessage,
    ErrorEvent,
    HistoryResetEvent,
    MessageEvent,
    MessagePartEvent,
    OtherEvent,
    PreviewResetEvent,
    QueueUpdateEvent,
    RetryEvent,
    StatusEvent,
    ToolCallRequest,
)
from coder_chat.protocol.retry import backoff, is_retryable, is_retryable_status
from coder_chat.protocol.transcript import (
    call_args,
    final_text,
    pending_calls,
    structured_output,
    to_transcript,
)
from coder_chat.protocol.translator import TurnTranslator

# -- wire builders ------------------------------------------------------------------------------
Json = dict[str, Any]


def msg(
    message_id: int,
    role: str,
    text: str = "",
    *,
    calls: list[Json] | None = None,
    results: list[Json] | None = None,
    usage: Json | None = None,
) -> Json:
    content: list[Json] = [{"type": "text", "text": text}] if text else []
    for call in calls or []:
        content.append({"type": "tool-call", **call})
    for result in results or []:
        content.append({"type": "tool-result", **result})
    out: Json = {"id": message_id, "chat_id": "c", "role": role, "content": content}
    if usage is not None:
        out["usage"] = usage
    return out


def message_event(*args: Any, **kwargs: Any) -> Json:
    return {"type": "message", "chat_id": "c", "message": msg(*args, **kwargs)}


def delta(seq: int | None, text: str, hv: int | None = 1, ga: int | None = 0) -> Json:
    part: Json = {"role": "assistant", "part": {"type": "text", "text": text}}
    if seq is not None:
        part.update(history_version=hv, generation_attempt=ga, seq=seq)
    return {"type": "message_part", "chat_id": "c", "message_part": part}


def status(value: str) -> Json:
    return {"type": "status", "chat_id": "c", "status": {"status": value}}


def action(*calls: tuple[str, str, Json]) -> Json:
    return {
        "type": "action_required",
        "chat_id": "c",
        "action_required": {
            "tool_calls": [
                {"tool_call_id": i, "tool_name": n, "args": json.dumps(a)} for i, n, a in calls
            ]
        },
    }


def events(*items: Json) -> list[AnyEvent]:
    return parse_frame(json.dumps(list(items)))


def one(item: Json) -> AnyEvent:
    (event,) = events(item)
    return event


def messages(*items: Json) -> list[ChatMessage]:
    return [ChatMessage.model_validate(i) for i in items]


# -- frames -----------------------------------------------------------------------------------------
def test_a_frame_is_an_array_of_typed_events() -> None:
    parsed = events(
        message_event(1, "user", "hi"),
        delta(1, "He"),
        status("running"),
        {
            "type": "error",
            "chat_id": "c",
            "error": {"message": "m", "kind": "rate_limit", "retryable": True},
        },
        action(("call_1", "lookup", {"q": 1})),
        {"type": "queue_update", "chat_id": "c", "queued_messages": []},
        {"type": "retry", "chat_id": "c", "retry": {"attempt": 1, "delay_ms": 10}},
        {"type": "preview_reset", "chat_id": "c"},
        {"type": "history_reset", "chat_id": "c"},
    )
    assert [type(e) for e in parsed] == [
        MessageEvent,
        MessagePartEvent,
        StatusEvent,
        ErrorEvent,
        ActionRequiredEvent,
        QueueUpdateEvent,
        RetryEvent,
        PreviewResetEvent,
        HistoryResetEvent,
    ]
    part = parsed[1]
    assert isinstance(part, MessagePartEvent)
    coordinates = part.message_part
    assert (coordinates.history_version, coordinates.generation_attempt, coordinates.seq) == (
        1,
        0,
        1,
    )
    assert coordinates.part.text == "He"
    error = parsed[3]
    assert isinstance(error, ErrorEvent)
    assert (error.error.kind, error.error.retryable) == ("rate_limit", True)
    required = parsed[4]
    assert isinstance(required, ActionRequiredEvent)
    assert required.action_required.tool_calls[0].args == '{"q": 1}'


def test_bare_objects_bytes_and_unknown_types_are_accepted() -> None:
    (bare,) = parse_frame(json.dumps(status("waiting")))
    assert isinstance(bare, StatusEvent) and bare.status.status == "waiting"
    (as_bytes,) = parse_frame(json.dumps([status("running")]).encode())
    assert isinstance(as_bytes, StatusEvent)
    unknown = events({"type": "desktop_frame", "chat_id": 12, "pixels": [1, 2]}, status("waiting"))
    assert isinstance(unknown[0], OtherEvent) and unknown[0].type == "desktop_frame"
    assert isinstance(unknown[1], StatusEvent)
    assert parse_frame("[]") == []


def test_deltas_without_coordinates_parse_with_none() -> None:
    part = one(delta(None, "x"))
    assert isinstance(part, MessagePartEvent)
    assert part.message_part.seq is None and part.message_part.history_version is None


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        "42",
        '"text"',
        json.dumps([{"type": "status"}]),
        json.dumps([{"type": "message", "message": {"id": "x"}}]),
        json.dumps([{"no_type": 1}]),
        json.dumps([7]),
        json.dumps([{"type": "message_part", "message_part": {"part": "x"}}]),
        json.dumps(
            [{"type": "message_part", "message_part": {"part": {"type": "text", "text": 5}}}]
        ),
        json.dumps(
            [
                {
                    "type": "message_part",
                    "message_part": {"part": {"type": "text"}, "seq": "1", "history_version": 1},
                }
            ]
        ),
        b"\xff\xfe",
    ],
)
def test_unparsable_frames_raise_frame_error(raw: str | bytes) -> None:
    with pytest.raises(FrameError):
        parse_frame(raw)


# -- de-duplication ----------------------------------------------------------------------------------
def test_deltas_are_forwarded_once_per_episode_and_seq() -> None:
    ledger = StreamLedger()
    verdicts = [ledger.accept(one(delta(s, "x"))) for s in (1, 2, 3)]
    assert all(v.forward and v.progress for v in verdicts)
    # A redial replays the episode from seq 1: only what is new goes through.
    replay = [ledger.accept(one(delta(s, "x"))) for s in (1, 2, 3, 4)]
    assert [(v.forward, v.progress) for v in replay] == [
        (False, False),
        (False, False),
        (False, False),
        (True, True),
    ]
    # A new generation attempt (or history version) restarts seq at 1.
    assert ledger.accept(one(delta(1, "y", ga=1))).forward
    assert ledger.accept(one(delta(1, "z", hv=2))).forward
    assert not ledger.accept(one(delta(1, "y", ga=1))).forward


def test_messages_are_forwarded_once_per_revision_and_advance_the_cursor() -> None:
    ledger = StreamLedger(after_id=5)
    assert ledger.cursor == 5
    first = ledger.accept(one(message_event(9, "assistant", "hello")))
    assert first.forward and first.progress and ledger.cursor == 9
    again = ledger.accept(one(message_event(9, "assistant", "hello")))
    assert not again.forward and not again.progress
    revised = ledger.accept(one(message_event(9, "assistant", "hello, world")))
    assert revised.forward and revised.progress
    with_usage = ledger.accept(
        one(message_event(9, "assistant", "hello, world", usage={"output_tokens": 2}))
    )
    assert with_usage.forward
    assert ledger.accept(one(message_event(7, "user", "older"))).forward
    assert ledger.cursor == 9  # the cursor never moves back


def test_status_and_resets_are_forwarded_without_progress() -> None:
    ledger = StreamLedger()
    for item in (status("running"), {"type": "preview_reset"}, {"type": "queue_update"}):
        verdict = ledger.accept(one(item))
        assert verdict.forward and not verdict.progress
    ledger.accept(one(message_event(3, "user", "hi")))
    ledger.accept(one(delta(4, "x")))
    ledger.accept(one({"type": "history_reset"}))
    # After a reset the full history is sent again and goes through again.
    assert ledger.accept(one(message_event(3, "user", "hi"))).progress
    assert ledger.accept(one(delta(4, "x"))).forward


def test_uncoordinated_deltas_mark_the_ledger_until_the_next_commit() -> None:
    ledger = StreamLedger()
    verdict = ledger.accept(one(delta(None, "x")))
    assert verdict.forward and verdict.progress
    assert flagged(ledger)
    ledger.accept(one({"type": "preview_reset"}))
    assert not flagged(ledger)
    ledger.accept(one(delta(None, "y")))
    ledger.accept(one(message_event(2, "assistant", "xy")))
    assert not flagged(ledger)


def flagged(ledger: StreamLedger) -> bool:
    return ledger.uncoordinated


# -- the turn translator ------------------------------------------------------------------------------------
def feed(translator: TurnTranslator, *items: Json) -> TurnTranslator:
    for event in events(*items):
        translator.ingest(event)
    return translator


def test_a_turn_opens_at_its_own_message_and_settles_on_waiting() -> None:
    t = TurnTranslator(client_tools=frozenset(), anchor_id=10)
    feed(
        t,
        message_event(8, "user", "old"),
        message_event(9, "assistant", "old answer"),
        status("waiting"),
    )
    assert (t.opened, t.finish) == (False, None)  # an earlier run's status is not this turn's
    feed(
        t,
        message_event(10, "user", "new"),
        status("running"),
        message_event(
            12,
            "assistant",
            "new answer",
            usage={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
        ),
    )
    assert (t.opened, t.finish) == (True, None)
    feed(t, status("waiting"))
    assert t.finish == "stop"
    assert [m.id for m in t.messages] == [10, 12]
    assert (t.usage().input_tokens, t.usage().output_tokens, t.usage().total_tokens) == (3, 2, 5)


def test_a_queued_prompt_opens_at_its_promoted_message() -> None:
    t = TurnTranslator(client_tools=frozenset(), anchor_text="second ")
    feed(
        t,
        message_event(20, "user", "first"),
        status("running"),
        message_event(21, "assistant", "first answer", usage={"output_tokens": 9}),
        message_event(22, "user", "second"),  # promoted: the window opens here
        message_event(23, "assistant", "second answer", usage={"output_tokens": 4}),
    )
    assert t.opened and t.anchor_id == 22
    assert [m.id for m in t.messages] == [22, 23]
    assert t.usage().output_tokens == 4
    feed(t, status("waiting"))
    assert t.finish == "stop"


def test_a_finishing_turn_settles_at_the_next_promoted_prompt() -> None:
    t = TurnTranslator(client_tools=frozenset(), anchor_id=30)
    feed(
        t,
        message_event(30, "user", "mine"),
        status("running"),
        message_event(31, "assistant", "my answer"),
        message_event(32, "user", "someone else's queued prompt"),  # no terminal status in era C
        message_event(33, "assistant", "their answer"),
    )
    assert t.finish == "stop"
    assert t.status == "running"
    assert [m.id for m in t.messages] == [30, 31]
    feed(t, status("error"))  # the next turn failing is not this turn's ending
    assert (t.finish, t.error) == ("stop", None)


def test_client_tool_pause_and_resume() -> None:
    t = TurnTranslator(client_tools=frozenset({"lookup"}), anchor_id=1)
    feed(t, message_event(1, "user", "go"), status("running"), status("requires_action"))
    assert (t.awaiting_action, t.finish) == (True, None)  # paused; the calls are not known yet
    feed(t, action(("call_1", "lookup", {"q": "a"})))
    assert (t.finish, t.awaiting_action) == ("tool-calls", False)
    assert [c.tool_call_id for c in t.pending] == ["call_1"]

    t.resume(["call_1"])
    assert (t.finish, t.pending, t.status) == (None, [], "running")
    # A replayed pause (after a redial) offers nothing new.
    feed(t, status("requires_action"), action(("call_1", "lookup", {"q": "a"})))
    assert (t.finish, t.awaiting_action) == (None, True)
    feed(t, status("running"))
    assert (t.finish, t.awaiting_action) == (None, False)
    # History recovery offers calls the same way.
    feed(t, status("requires_action"))
    t.offer_calls([ToolCallRequest(tool_call_id="call_2", tool_name="lookup", args="{}")])
    assert t.finish == "tool-calls" and [c.tool_call_id for c in t.pending] == ["call_2"]


def test_calls_are_not_taken_while_the_chat_runs() -> None:
    t = TurnTranslator(client_tools=frozenset({"lookup"}), anchor_id=1)
    feed(t, message_event(1, "user", "go"), status("running"), action(("call_1", "lookup", {})))
    assert (t.finish, t.pending) == (None, [])


def test_error_status_and_its_payload() -> None:
    t = TurnTranslator(client_tools=frozenset(), anchor_id=1)
    feed(
        t,
        message_event(1, "user", "go"),
        status("error"),
        {
            "type": "error",
            "chat_id": "c",
            "error": {"message": "busy", "kind": "overloaded", "retryable": True},
        },
    )
    assert t.finish == "error"
    assert t.error is not None and (t.error.kind, t.error.retryable) == ("overloaded", True)


def test_history_reset_recollects_only_this_turns_messages() -> None:
    t = TurnTranslator(client_tools=frozenset(), anchor_id=5)
    feed(t, message_event(5, "user", "mine"), message_event(6, "assistant", "draft"))
    feed(
        t,
        {"type": "history_reset"},
        message_event(1, "user", "old"),
        message_event(2, "assistant", "old answer"),
        message_event(5, "user", "mine"),
        message_event(6, "assistant", "final"),
    )
    assert [(m.id, m.text()) for m in t.messages] == [(5, "mine"), (6, "final")]
    assert t.finish is None


# -- transcripts -------------------------------------------------------------------------------------------
HISTORY = messages(
    msg(
        3,
        "assistant",
        "later",
        calls=[{"tool_call_id": "a", "tool_name": "lookup", "args": {"q": 1}}],
    ),
    msg(1, "user", "hi"),
    msg(4, "tool", results=[{"tool_call_id": "a", "tool_name": "lookup", "result": "r"}]),
    msg(
        5,
        "assistant",
        "Narration.",
        calls=[{"tool_call_id": "s", "tool_name": "deploy", "args": {}}],
    ),
    msg(6, "tool", results=[{"tool_call_id": "s", "tool_name": "deploy", "result": {"ok": True}}]),
    msg(7, "assistant", " Done."),
    msg(
        3,
        "assistant",
        "later",
        calls=[{"tool_call_id": "a", "tool_name": "lookup", "args": {"q": 1}}],
    ),
)


def test_transcript_orders_by_id_once_per_id() -> None:
    transcript = to_transcript(HISTORY)
    assert [m.id for m in transcript.messages] == [1, 3, 4, 5, 6, 7]
    last_user = transcript.last_user()
    assert last_user is not None and last_user.id == 1
    assert [m.id for m in transcript.after(last_user)] == [3, 4, 5, 6, 7]


def test_final_text_cuts_at_the_last_client_tool_only() -> None:
    ordered = to_transcript(HISTORY).messages
    assert final_text(ordered, {"lookup"}) == "Narration. Done."
    assert final_text(ordered, {"lookup", "deploy"}) == " Done."
    assert final_text(ordered, set()) == "laterNarration. Done."
    provider = to_transcript(
        messages(
            msg(
                1,
                "assistant",
                "a",
                calls=[{"tool_call_id": "p", "tool_name": "lookup", "provider_executed": True}],
            ),
            msg(2, "assistant", "b"),
        )
    ).messages
    assert final_text(provider, {"lookup"}) == "ab"


class Verdict(BaseModel):
    score: int


def test_structured_output_takes_the_last_call_that_validates() -> None:
    history = to_transcript(
        messages(
            msg(
                1,
                "assistant",
                calls=[
                    {"tool_call_id": "1", "tool_name": "structured_output", "args": {"score": 1}}
                ],
            ),
            msg(
                2,
                "assistant",
                calls=[
                    {"tool_call_id": "2", "tool_name": "structured_output", "args": '{"score": 2}'}
                ],
            ),
            msg(
                3,
                "assistant",
                calls=[
                    {
                        "tool_call_id": "3",
                        "tool_name": "structured_output",
                        "args": {"score": "bad"},
                    }
                ],
            ),
        )
    ).messages
    assert structured_output(history, Verdict) == Verdict(score=2)
    assert structured_output(history[:0], Verdict) is None


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ('{"a": 1}', {"a": 1}),
        ("", {}),
        ("  ", {}),
        (None, {}),
        ({"b": 2}, {"b": 2}),
        ("not json", "not json"),
    ],
)
def test_call_args(raw: Any, value: Any) -> None:
    assert call_args(raw) == value


def test_pending_calls_from_history() -> None:
    history = messages(
        msg(1, "user", "go"),
        msg(
            2,
            "assistant",
            calls=[
                {"tool_call_id": "a", "tool_name": "lookup", "args": {"q": 1}},
                {"tool_call_id": "b", "tool_name": "lookup"},
                {"tool_call_id": "c", "tool_name": "deploy", "args": {}},  # a server tool
                {"tool_call_id": "d", "tool_name": "lookup", "provider_executed": True},
                {"tool_call_id": "e", "tool_name": "lookup", "args": '{"raw": true}'},
            ],
        ),
        msg(3, "tool", results=[{"tool_call_id": "a", "tool_name": "lookup", "result": 1}]),
    )
    # Every unanswered call the pause waits on, whatever its name (Coder wants them all in
    # one request); provider-executed and already answered ones are not pending.
    pending = pending_calls(list(reversed(history)), exclude={"e"})
    assert [(c.tool_call_id, c.args) for c in pending.requests()] == [("b", "{}"), ("c", "{}")]
    assert pending.prompt is not None and pending.prompt.text() == "go"
    requests = pending_calls(history).requests()
    assert [c.tool_call_id for c in requests] == ["b", "c", "e"]
    assert requests[2].args == '{"raw": true}'
    assert pending_calls(messages(msg(1, "user", "x"))).calls == []


def test_steps_pair_calls_with_results() -> None:
    steps = build_steps(to_transcript_messages(HISTORY))
    assert [s.message_id for s in steps] == [3, 5, 7]
    (call,) = steps[0].tool_calls
    assert (call.tool_name, call.args, call.output, call.is_error) == (
        "lookup",
        {"q": 1},
        "r",
        False,
    )
    assert steps[1].tool_calls[0].output == {"ok": True}
    assert steps[2].tool_calls == []


def to_transcript_messages(history: list[ChatMessage]) -> list[ChatMessage]:
    by_id = {m.id: m for m in history}
    return [by_id[i] for i in sorted(by_id)]


# -- retry judgment and backoff ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status_code", "retryable"),
    [
        (408, True),
        (425, True),
        (429, True),
        (500, True),
        (503, True),
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (409, False),
    ],
)
def test_retryable_statuses(status_code: int, retryable: bool) -> None:
    assert is_retryable_status(status_code) is retryable
    assert is_retryable(errors.CoderApiError(status_code, "GET", "/p", "m")) is retryable


def test_is_retryable_for_every_error() -> None:
    assert is_retryable(errors.CoderTransportError("GET /p", "reset"))
    assert is_retryable(errors.CoderChatError("t", kind="timeout", retryable=True))
    assert not is_retryable(errors.CoderChatError("f", kind="config", retryable=False))
    assert is_retryable(errors.CoderStreamError("s", chat_id="c", retryable=True))
    assert not is_retryable(errors.CoderStreamError("s", chat_id="c", retryable=False))
    assert is_retryable(errors.CoderStoreError("db", retryable=True))
    assert not is_retryable(errors.CoderConfigError("bad"))
    assert not is_retryable(asyncio.CancelledError())
    assert not is_retryable(RuntimeError("ours"))


def test_backoff_doubles_up_to_its_cap() -> None:
    assert list(itertools.islice(backoff(), 7)) == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert list(itertools.islice(backoff(0.01, 2.0, 0.05), 4)) == [0.01, 0.02, 0.04, 0.05]


def test_errors_survive_pickling_with_their_fields() -> None:
    api = pickle.loads(pickle.dumps(errors.CoderApiError(409, "PATCH", "/p", "busy", "later")))
    assert (api.status, api.method, api.path, api.message, api.detail) == (
        409,
        "PATCH",
        "/p",
        "busy",
        "later",
    )
    assert str(api) == "Coder API PATCH /p failed (409): busy — later"
    chat = pickle.loads(
        pickle.dumps(errors.CoderChatError("m", kind="timeout", retryable=True, chat_id="c"))
    )
    assert (chat.kind, chat.retryable, chat.chat_id) == ("timeout", True, "c")
    stream = pickle.loads(pickle.dumps(errors.CoderStreamError("s", chat_id="c", retryable=True)))
    assert (stream.chat_id, stream.retryable) == ("c", True)
    transport = pickle.loads(pickle.dumps(errors.CoderTransportError("GET /p", "reset")))
    assert (transport.operation, transport.reason) == ("GET /p", "reset")
    assert all(
        isinstance(e, errors.CoderError)
        for e in (api, chat, stream, transport, errors.CoderConfigError("x"))
    )


def test_every_error_keeps_its_type_message_and_fields_through_pickling() -> None:
    fence = Fence(tenant="t", workflow_id="wf", epoch=2)
    errors: list[CoderError] = [
        CoderToolError("charge", "call-1", "timeout"),
        CoderStoreError("down", retryable=True),
        FencedOut(fence, 3),
        PromptChanged("wf", 2, "ran this", "asked that", finished=False),
        CoderConfigError("bad"),
    ]
    for error in errors:
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error)
        assert (str(again), vars(again)) == (str(error), vars(error))
    fenced = pickle.loads(pickle.dumps(FencedOut(fence, 3)))
    assert (fenced.fence, fenced.current, fenced.retryable) == (fence, 3, False)


# -- tools --------------------------------------------------------------------------------------------------------
class Place(BaseModel):
    name: str
    population: int


async def book(city: str, nights: int = 1, idempotency_key: str = "") -> dict[str, Any]:
    """Book a hotel."""
    return {"city": city, "nights": nights, "key": idempotency_key}


async def describe(place: Place, tags: list[str] | None = None) -> Place:
    """Describe a place."""
    return place


async def untyped(x, y=2):  # type: ignore[no-untyped-def]
    return x


def test_tool_declaration_from_typed_parameters() -> None:
    tool = client_tool(book)
    assert tool.name == "book" and tool.takes_idempotency_key
    declared = tool.declaration()
    assert declared.description == "Book a hotel."
    schema = declared.input_schema
    assert "title" not in schema
    assert set(schema["properties"]) == {"city", "nights"}
    assert schema["required"] == ["city"]
    assert schema["properties"]["nights"]["default"] == 1
    assert schema["additionalProperties"] is False

    nested = client_tool(describe).declaration().input_schema
    assert nested["required"] == ["place"]
    assert "$defs" in nested and "Place" in nested["$defs"]
    assert not client_tool(describe).takes_idempotency_key
    loose = client_tool(untyped).declaration().input_schema
    assert set(loose["properties"]) == {"x", "y"}


def test_a_declaration_changed_by_its_caller_leaves_the_next_one_whole() -> None:
    """Schemas are made once per tool and shared: what one chat's declaration does to
    its own copy must not reach the next chat's."""
    tool = client_tool(book)
    first = tool.declaration()
    first.input_schema.pop("required")
    first.input_schema["properties"].pop("city")
    again = tool.declaration().input_schema
    assert again["required"] == ["city"] and set(again["properties"]) == {"city", "nights"}


CALL = ToolCallContext("org", "chat", "k")


async def test_tool_validation_and_invocation() -> None:
    tool = client_tool(book)
    args = tool.validate('{"city": "Oslo", "nights": 2}')
    assert await tool.invoke(args, ToolCallContext("org", "chat", "call")) == {
        "city": "Oslo",
        "nights": 2,
        "key": "org/chat/call",
    }
    assert tool.validate({"city": "Rome"}).model_dump() == {"city": "Rome", "nights": 1}
    for bad in ('{"nights": 2}', '{"city": 1}', '{"city": "x", "spa": true}', "not json"):
        with pytest.raises(ToolArgumentsError, match="invalid arguments"):
            tool.validate(bad)

    place = client_tool(describe)
    parsed = place.validate({"place": {"name": "Oslo", "population": 700000}})
    assert await place.invoke(parsed, CALL) == Place(name="Oslo", population=700000)


def test_tools_that_cannot_be_described_are_rejected() -> None:
    def sync_tool(x: int) -> int:
        return x

    async def star(*args: int) -> int:
        return 0

    async def double_star(**kwargs: int) -> int:
        return 0

    with pytest.raises(errors.CoderConfigError, match="async"):
        client_tool(sync_tool)  # type: ignore[arg-type]
    for bad in (star, double_star):
        with pytest.raises(errors.CoderConfigError, match=r"\*args"):
            client_tool(bad)
    ready = client_tool(book)
    assert client_tool(ready) is ready


async def test_structured_output_tool() -> None:
    tool = structured_output_tool(Place)
    assert isinstance(tool, ClientTool)
    assert tool.name == "structured_output" and tool.function is None
    assert set(tool.declaration().input_schema["properties"]) == {"name", "population"}
    assert tool.validate('{"name": "x", "population": 1}') == Place(name="x", population=1)
    with pytest.raises(errors.CoderConfigError):
        await tool.invoke(Place(name="x", population=1), CALL)


def test_tool_output_is_json() -> None:
    assert tool_output(Place(name="x", population=1)) == {"name": "x", "population": 1}
    assert tool_output({"a": [1, 2]}) == {"a": [1, 2]}
    assert tool_output(None) is None
    assert tool_output({1, 2}) in ("{1, 2}", "{2, 1}")
    assert tool_output(object).startswith("<class")
