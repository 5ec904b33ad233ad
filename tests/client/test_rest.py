"""``ChatClient`` against the simulator over real sockets: every endpoint, errors, retries."""

from __future__ import annotations

import logging
import socket
import uuid

import pytest
from websockets.http11 import Request, Response

from coder_chat import ChatClient
from coder_chat.client.events import HttpError, HttpRequest, HttpResponse
from coder_chat.errors import CoderApiError, CoderConfigError, CoderTransportError
from coder_chat.protocol.models import DynamicTool
from coder_chat.simulator import Simulator

from .helpers import (
    Recorder,
    client_for,
    frame_server,
    http_response,
    idle_chat,
    requests_of,
    token_free,
)

V2 = "/api/v2/chats"
EXP = "/api/experimental/chats"
NOT_FOUND = "Resource not found or you do not have access to this resource"


# -- chats ------------------------------------------------------------------------------------
async def test_create_get_update_and_list_chats(sim: Simulator) -> None:
    org = str(sim.organization_id)
    async with client_for(sim) as client:
        tool = DynamicTool(
            name="lookup",
            description="Look it up.",
            input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
        )
        chat = await client.create_chat(
            organization_id=org,
            content="hello there",
            system_prompt="Be brief.",
            labels={"workflow": "nightly", "run": "42"},
            tools=[tool],
        )
        assert chat.status == "running"
        assert chat.labels == {"workflow": "nightly", "run": "42"}
        stored = sim.chat(chat.id)
        assert stored.system_prompt == "Be brief."
        assert stored.client_type == "api"
        assert [t["name"] for t in stored.dynamic_tools] == ["lookup"]
        assert stored.dynamic_tools[0]["input_schema"]["properties"] == {"q": {"type": "string"}}

        await sim.wait_for_status(chat.id, "waiting")
        fetched = await client.get_chat(chat.id)
        assert fetched.id == chat.id and fetched.status == "waiting"

        other = await client.create_chat(
            organization_id=org, content="other", labels={"workflow": "nightly"}
        )
        nightly = await client.list_chats(labels={"workflow": "nightly"})
        assert {c.id for c in nightly} == {chat.id, other.id}
        both = await client.list_chats(labels={"workflow": "nightly", "run": "42"})
        assert [c.id for c in both] == [chat.id]

        await client.update_chat(chat.id, title="Renamed", labels={"workflow": "weekly"})
        assert sim.chat(chat.id).title == "Renamed"
        assert sim.chat(chat.id).labels == {"workflow": "weekly"}

        await client.archive_chat(chat.id)
        assert sim.chat(chat.id).archived
        visible = await client.list_chats()
        assert chat.id not in {c.id for c in visible}
        archived = await client.list_chats(archived=True)
        assert [c.id for c in archived] == [chat.id]


async def test_iter_chats_pages_through_everything(sim: Simulator) -> None:
    seeded = {str(i) for i in sim.seed(5, labels={"sweep": "yes"})}
    sim.seed(2, labels={"sweep": "no"})
    async with client_for(sim) as client:
        found = [c.id async for c in client.iter_chats(labels={"sweep": "yes"}, page_size=2)]
    assert sorted(found) == sorted(seeded)
    assert len(found) == len(set(found))
    # Five chats in pages of two: three list calls (2 + 2 + 1).
    assert len(requests_of(sim, "list_chats")) == 3


# -- messages ---------------------------------------------------------------------------------
async def test_get_and_iterate_messages(sim: Simulator) -> None:
    chat_id = await idle_chat(sim, "first")
    async with client_for(sim) as client:
        await client.send_message(chat_id, "second")
        await sim.wait_for_status(chat_id, "waiting")
        ids = [m.id for m in sim.messages(chat_id)]
        assert len(ids) == 4

        newest = await client.get_messages(chat_id, limit=1)
        assert [m.id for m in newest.messages] == [ids[-1]]
        assert newest.has_more

        ascending = await client.get_messages(chat_id, after_id=ids[0])
        assert [m.id for m in ascending.messages] == ids[1:]

        older = await client.get_messages(chat_id, before_id=ids[2])
        assert [m.id for m in older.messages] == [ids[1], ids[0]]

        walked = [m.id async for m in client.iter_messages(chat_id, page_size=1)]
        assert walked == list(reversed(ids))
        assert newest.messages[0].role == "assistant"
        assert newest.messages[0].text() == 'You said: "second"'


async def test_send_direct_and_queued_then_delete_and_promote(sim: Simulator) -> None:
    (busy,) = sim.seed(1, status="running")  # stays running until interrupted
    # Interrupted by the promote, it winds down for longer than the test: its queue is
    # still there for the deletes to act on (after a short wind-down the promoted entry
    # would run and empty the queue on a loaded machine, and the last delete get a 409).
    sim.config.interrupt_winddown = 60.0
    idle = await idle_chat(sim)
    async with client_for(sim) as client:
        direct = await client.send_message(idle, "now")
        assert not direct.queued and direct.message is not None
        assert direct.message.role == "user" and direct.message.text() == "now"

        first = await client.send_message(str(busy), "later one")
        second = await client.send_message(str(busy), "later two")
        assert first.queued and first.message is None and first.queued_message is not None
        assert second.queued_message is not None
        assert [q.id for q in sim.chat(busy).queue] == [
            first.queued_message.id,
            second.queued_message.id,
        ]

        await client.promote_queued_message(str(busy), second.queued_message.id)
        # Promoting on a running chat moves the entry to the head and interrupts the run.
        assert sim.chat(busy).queue[0].id == second.queued_message.id
        assert sim.chat(busy).status == "interrupting"

        await client.delete_queued_message(str(busy), first.queued_message.id)
        assert [q.id for q in sim.chat(busy).queue] == [second.queued_message.id]

        with pytest.raises(CoderApiError) as missing:
            await client.delete_queued_message(str(busy), 999_999)
        assert missing.value.status == 404
        assert missing.value.message == "Queued message not found."


async def test_submit_tool_results_and_its_validation(sim: Simulator) -> None:
    (paused,) = sim.seed(1, status="requires_action", tool_name="lookup")
    chat_id = str(paused)
    async with client_for(sim) as client:
        with pytest.raises(CoderApiError) as wrong:
            await client.submit_tool_results(
                chat_id,
                [
                    {"tool_call_id": "call_seed_0", "output": 1, "is_error": False},
                    {"tool_call_id": "nope", "output": 1, "is_error": False},
                ],
            )
        assert wrong.value.status == 400
        assert wrong.value.message == "Unexpected tool result."
        assert wrong.value.detail == 'No pending tool call with ID "nope".'

        await client.submit_tool_results(
            chat_id, [{"tool_call_id": "call_seed_0", "output": {"temp": 21}, "is_error": False}]
        )
    (record,) = sim.records.tool_results
    assert (record.tool_call_id, record.output, record.is_error) == (
        "call_seed_0",
        {"temp": 21},
        False,
    )
    await sim.wait_for_status(chat_id, "waiting")


async def test_interrupt_running_and_idle(sim: Simulator) -> None:
    (busy,) = sim.seed(1, status="running")
    async with client_for(sim) as client:
        chat = await client.interrupt_chat(str(busy))
        assert chat.status == "interrupting"
        await sim.wait_for_status(busy, "waiting")
        with pytest.raises(CoderApiError) as idle:
            await client.interrupt_chat(str(busy))
    assert idle.value.status == 409
    assert idle.value.message == "Chat is not in an interruptible state."
    assert [r.http_status for r in sim.records.interrupts] == [200, 409]


# -- files and models ---------------------------------------------------------------------------
async def test_upload_download_and_model_configs(sim: Simulator) -> None:
    org = str(sim.organization_id)
    async with client_for(sim) as client:
        file_id = await client.upload_file(
            organization_id=org, data=b"hello, file", media_type="text/plain", filename="a.txt"
        )
        data, media_type = await client.download_file(file_id)
        assert (data, media_type) == (b"hello, file", "text/plain")

        with pytest.raises(CoderApiError) as bad_type:
            await client.upload_file(organization_id=org, data=b"x", media_type="video/mp4")
        assert bad_type.value.status == 400
        assert bad_type.value.message == "Unsupported file type."

        org_models = await client.model_configs(organization_id=org)
        legacy = await client.model_configs()
        unknown_org = await client.model_configs(organization_id=str(uuid.uuid4()))
    assert [m.model for m in org_models] == ["echo-1", "echo-1-mini"]
    assert all(m.ai_provider_id for m in org_models)
    assert [m.model for m in legacy] == ["echo-1", "echo-1-mini"]
    assert all(m.provider == "simulator" for m in legacy)
    # An org the server does not know answers 404: the legacy listing is used instead.
    assert [m.id for m in unknown_org] == [m.id for m in legacy]


# -- errors -----------------------------------------------------------------------------------
async def test_every_non_2xx_is_a_coder_api_error_with_its_fields(sim: Simulator) -> None:
    async with client_for(sim) as client:
        with pytest.raises(CoderApiError) as invalid:
            await client.create_chat(
                organization_id=str(sim.organization_id), content="hi", labels={"-bad": "x"}
            )
        missing_id = str(uuid.uuid4())
        with pytest.raises(CoderApiError) as missing:
            await client.get_chat(missing_id)
    error = invalid.value
    assert (error.status, error.method, error.path) == (400, "POST", V2)
    assert error.message == "Invalid labels."
    assert error.detail is not None and "labels.-bad" in error.detail
    assert str(error).startswith(f"Coder API POST {V2} failed (400): Invalid labels. — ")

    assert missing.value.status == 404
    assert missing.value.method == "GET"
    assert missing.value.path == f"{V2}/{missing_id}"
    assert missing.value.message == NOT_FOUND
    assert missing.value.detail is None


async def test_a_non_json_error_body_uses_the_reason_phrase() -> None:
    def gateway(request: Request) -> Response:
        return http_response(502, b"upstream is down", "text/plain")

    async with (
        frame_server(http=gateway) as base_url,
        ChatClient(base_url=base_url, token="t", read_retries=0) as client,
    ):
        with pytest.raises(CoderApiError) as failed:
            await client.get_chat("c")
    assert (failed.value.status, failed.value.message, failed.value.detail) == (
        502,
        "Bad Gateway",
        None,
    )
    assert failed.value.path == f"{V2}/c"


async def test_reads_are_retried_on_5xx_and_429(sim: Simulator) -> None:
    chat_id = await idle_chat(sim)
    sim.records.clear_requests()
    sim.faults.fail_next("get_chat", 503, 2)
    sim.faults.fail_next("get_messages", 429, 2)
    async with client_for(sim) as client:
        chat = await client.get_chat(chat_id)
        page = await client.get_messages(chat_id, limit=1)
    assert chat.id == chat_id
    assert len(page.messages) == 1
    assert [r.status for r in requests_of(sim, "get_chat")] == [503, 503, 200]
    assert [r.status for r in requests_of(sim, "get_messages")] == [429, 429, 200]


async def test_read_retries_are_bounded(sim: Simulator) -> None:
    chat_id = await idle_chat(sim)
    sim.records.clear_requests()
    sim.faults.fail_next("get_chat", 503, 5)
    async with client_for(sim, read_retries=2) as client:
        with pytest.raises(CoderApiError) as failed:
            await client.get_chat(chat_id)
    assert failed.value.status == 503
    assert len(requests_of(sim, "get_chat")) == 3


async def test_a_4xx_read_is_not_retried(sim: Simulator) -> None:
    chat_id = await idle_chat(sim)
    sim.records.clear_requests()
    sim.faults.fail_next("get_chat", 403, 1)
    async with client_for(sim) as client:
        with pytest.raises(CoderApiError) as failed:
            await client.get_chat(chat_id)
    assert failed.value.status == 403
    assert len(requests_of(sim, "get_chat")) == 1


@pytest.mark.parametrize("status", [503, 429])
async def test_create_send_and_tool_results_are_never_retried(sim: Simulator, status: int) -> None:
    chat_id = await idle_chat(sim)
    (paused,) = sim.seed(1, status="requires_action")
    sim.records.clear_requests()
    async with client_for(sim) as client:
        sim.faults.fail_next("create_chat", status)
        with pytest.raises(CoderApiError) as create:
            await client.create_chat(organization_id=str(sim.organization_id), content="x")
        sim.faults.fail_next("send_message", status)
        with pytest.raises(CoderApiError) as send:
            await client.send_message(chat_id, "y")
        sim.faults.fail_next("tool_results", status)
        with pytest.raises(CoderApiError) as results:
            await client.submit_tool_results(
                str(paused), [{"tool_call_id": "call_seed_0", "output": 1}]
            )
    assert create.value.status == send.value.status == results.value.status == status
    for route in ("create_chat", "send_message", "tool_results"):
        assert [r.status for r in requests_of(sim, route)] == [status], route
    assert len(sim.chats()) == 2  # no chat was created behind the error
    assert len(sim.messages(chat_id)) == 2  # nor a message sent


async def test_a_send_cut_on_the_wire_is_a_transport_error_and_not_retried(
    sim: Simulator,
) -> None:
    chat_id = await idle_chat(sim)
    sim.records.clear_requests()
    recorder = Recorder()
    sim.faults.cut_before_commit("send_message")
    async with client_for(sim, on_transport_event=recorder) as client:
        with pytest.raises(CoderTransportError) as cut:
            await client.send_message(chat_id, "lost")
    assert cut.value.operation == f"POST {V2}/{chat_id}/messages"
    assert len(requests_of(sim, "send_message")) == 1
    assert len(sim.messages(chat_id)) == 2
    (error,) = [e for e in recorder.events if isinstance(e, HttpError)]
    assert (error.op, error.method, error.path) == (
        "send_message",
        "POST",
        f"{V2}/{chat_id}/messages",
    )


async def test_transport_error_when_nothing_listens() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = "secret-token-for-closed-port"
    recorder = Recorder()
    async with ChatClient(
        base_url=f"http://127.0.0.1:{port}",
        token=token,
        read_retries=0,
        on_transport_event=recorder,
    ) as client:
        with pytest.raises(CoderTransportError) as failed:
            await client.list_chats()
    assert failed.value.operation == f"GET {V2}"
    assert [e.type for e in recorder.events] == ["http:request", "http:error"]
    assert token_free(token, [failed.value, *recorder.events]) == []


# -- prefix negotiation -----------------------------------------------------------------------------
async def test_falls_back_to_experimental_routes_and_remembers(sim: Simulator) -> None:
    chat_id = await idle_chat(sim)
    sim.config.era_b.experimental_routes_only = True
    sim.records.clear_requests()
    async with client_for(sim) as client:
        chats = await client.list_chats()
        chat = await client.get_chat(chat_id)
        await client.send_message(chat_id, "again")
        await client.get_messages(chat_id)
        assert await client.resolve_prefix() == EXP
    assert [c.id for c in chats] == [chat_id]
    assert chat.id == chat_id
    paths = [r.path for r in sim.records.requests]
    # Exactly one v2 attempt (the first call), everything after goes straight to experimental.
    assert [p for p in paths if p.startswith(V2)] == [V2]
    assert paths[1:] == [
        EXP,
        f"{EXP}/{chat_id}",
        f"{EXP}/{chat_id}/messages",
        f"{EXP}/{chat_id}/messages",
    ]

    # The choice is per client: a new client negotiates again.
    sim.records.clear_requests()
    async with client_for(sim) as fresh:
        await fresh.get_chat(chat_id)
    assert [r.path for r in sim.records.requests] == [f"{V2}/{chat_id}", f"{EXP}/{chat_id}"]


async def test_v2_locks_on_its_first_non_404_answer(sim: Simulator) -> None:
    chat_id = await idle_chat(sim)
    sim.records.clear_requests()
    async with client_for(sim) as client:
        await client.get_chat(chat_id)
        await client.get_messages(chat_id)
    assert all(r.path.startswith(V2) for r in sim.records.requests)
    assert len(sim.records.requests) == 2


async def test_two_404s_surface_the_v2_error_and_keep_negotiating(sim: Simulator) -> None:
    chat_id = await idle_chat(sim)
    missing = str(uuid.uuid4())
    sim.config.era_b.experimental_routes_only = True
    sim.records.clear_requests()
    async with client_for(sim) as client:
        with pytest.raises(CoderApiError) as both:
            await client.get_chat(missing)
        assert both.value.path == f"{V2}/{missing}"
        # Still unresolved: the next call tries v2 first again, then locks experimental.
        await client.get_chat(chat_id)
        await client.get_chat(chat_id)
    assert [r.path for r in sim.records.requests] == [
        f"{V2}/{missing}",
        f"{EXP}/{missing}",
        f"{V2}/{chat_id}",
        f"{EXP}/{chat_id}",
        f"{EXP}/{chat_id}",
    ]


# -- transport events and the token ----------------------------------------------------------------
async def test_http_events_carry_op_names(sim: Simulator) -> None:
    chat_id = await idle_chat(sim)
    recorder = Recorder()
    async with client_for(sim, on_transport_event=recorder) as client:
        await client.get_chat(chat_id)
        await client.send_message(chat_id, "hi")
    requests = [e for e in recorder.events if isinstance(e, HttpRequest)]
    responses = [e for e in recorder.events if isinstance(e, HttpResponse)]
    assert [(e.op, e.method, e.path) for e in requests] == [
        ("get_chat", "GET", f"{V2}/{chat_id}"),
        ("send_message", "POST", f"{V2}/{chat_id}/messages"),
    ]
    assert [(e.op, e.status) for e in responses] == [("get_chat", 200), ("send_message", 200)]


async def test_the_token_never_shows(sim: Simulator, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    recorder = Recorder()
    async with client_for(sim, on_transport_event=recorder) as client:
        assert sim.token not in repr(client)
        chat = await client.create_chat(organization_id=str(sim.organization_id), content="hi")
        sim.faults.fail_next("send_message", 500)
        with pytest.raises(CoderApiError) as failed:
            await client.send_message(chat.id, "x")
        errors: list[object] = [failed.value]
    async with ChatClient(
        base_url=sim.base_url, token=sim.token + "-wrong", on_transport_event=recorder
    ) as wrong:
        with pytest.raises(CoderApiError) as unauthorized:
            await wrong.list_chats()
        assert sim.token not in repr(wrong)
    assert unauthorized.value.status == 401
    errors.append(unauthorized.value)
    assert token_free(sim.token, [*errors, *recorder.events]) == []
    assert all(sim.token not in r.getMessage() for r in caplog.records)


def test_construction_needs_url_and_token() -> None:
    with pytest.raises(CoderConfigError):
        ChatClient(base_url="", token="x")
    with pytest.raises(CoderConfigError):
        ChatClient(base_url="http://x", token="")
