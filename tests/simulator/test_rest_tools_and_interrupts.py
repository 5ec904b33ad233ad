"""Client tools and interrupts over plain HTTP (wire reference 3.8, 3.9, 4.3, 7)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest

from coder_chat.simulator import Simulator, serve_simulator
from tests.sim_timings import fast_config

from .wire import EXP, NOT_FOUND, V2, Wire, expect_error

NOT_INTERRUPTIBLE = "Chat is not in an interruptible state."
NOT_WAITING = "Chat is not waiting for tool results."
INTERRUPTED = "Tool execution interrupted by user"
TIMED_OUT = "Tool execution timed out"


def declare(*names: str) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "description": f"client tool {name}",
            "input_schema": {"type": "object", "properties": {"q": {"type": "integer"}}},
        }
        for name in names
    ]


async def paused_on_tools(
    sim: Simulator, wire: Wire, prompt: str, *names: str
) -> tuple[str, list[dict[str, Any]]]:
    """Create a chat whose first turn calls client tools; return it and its tool-call parts."""
    chat_id = (await wire.create(prompt, unsafe_dynamic_tools=declare(*names)))["id"]
    await sim.wait_for_status(chat_id, "requires_action")
    return chat_id, await pending_calls(wire, chat_id)


async def pending_calls(wire: Wire, chat_id: str) -> list[dict[str, Any]]:
    """The newest assistant message's tool-call parts, as a client would recover them."""
    page = await wire.messages(chat_id, limit=200)
    newest = next(m for m in page["messages"] if m["role"] == "assistant")
    return [p for p in newest["content"] if p["type"] == "tool-call"]


async def submit(wire: Wire, chat_id: str, results: Any) -> httpx.Response:
    return await wire.http.post(f"{wire.prefix}/{chat_id}/tool-results", json={"results": results})


async def interrupt(wire: Wire, chat_id: str) -> httpx.Response:
    return await wire.http.post(f"{wire.prefix}/{chat_id}/interrupt")


def tool_messages(sim: Simulator, chat_id: str) -> list[dict[str, Any]]:
    """Every committed tool-result part of the chat, oldest first."""
    return [
        part
        for m in sim.messages(chat_id)
        if m.role == "tool"
        for part in m.content
        if part["type"] == "tool-result"
    ]


# -- interrupt ----------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [V2, EXP])
async def test_interrupt_a_running_chat(sim: Simulator, prefix: str) -> None:
    async with Wire(sim, prefix) as wire:
        chat_id = (await wire.create("take your time /sleep 2"))["id"]
        response = await interrupt(wire, chat_id)
        assert response.status_code == 200, response.text
        chat = response.json()
        assert chat["id"] == chat_id
        assert chat["status"] == "interrupting"

        settled = await sim.wait_for_status(chat_id, "waiting")
        # Nothing was generated yet, so no partial assistant message is committed.
        assert [m.role for m in settled.visible_messages()] == ["user"]
        assert (await wire.http.get(f"{prefix}/{chat_id}")).json()["status"] == "waiting"
    [record] = sim.records.interrupts
    assert (record.chat_id, record.status_before, record.http_status) == (
        uuid.UUID(chat_id),
        "running",
        200,
    )


async def test_interrupt_commits_partial_output(sim: Simulator) -> None:
    sim.config.delta_interval = 0.02  # a reply slow enough to interrupt half way
    async with Wire(sim) as wire:
        chat_id = (await wire.create("hello /deltas 60"))["id"]
        async with wire.stream(chat_id) as reader:
            await reader.until(
                lambda e: e["type"] == "message_part" and e["message_part"]["seq"] >= 3
            )
            response = await interrupt(wire, chat_id)
            assert response.json()["status"] == "interrupting"
            seen = "".join(
                e["message_part"]["part"]["text"]
                for e in reader.events
                if e["type"] == "message_part"
            )
            await reader.until_status("waiting")

    messages = sim.messages(chat_id)
    assert [m.role for m in messages] == ["user", "assistant"]
    partial = messages[1].text()
    full = 'You said: "hello"'.ljust(60, ".")
    assert partial.startswith(seen)
    assert full.startswith(partial)
    assert len(partial) < len(full), "the reply was cut short"
    assert messages[1].usage is not None


async def test_interrupt_idle_chats_is_409(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        waiting = (await wire.create("done quickly"))["id"]
        failed = (await wire.create("break /fail fatal"))["id"]
        await sim.wait_for_status(waiting, "waiting")
        await sim.wait_for_status(failed, "error")
        for chat_id in (waiting, failed):
            expect_error(await interrupt(wire, chat_id), 409, NOT_INTERRUPTIBLE)
        assert sim.chat(waiting).status == "waiting"
        assert sim.chat(failed).status == "error"
    assert [(r.status_before, r.http_status) for r in sim.records.interrupts] == [
        ("waiting", 409),
        ("error", 409),
    ]


async def test_interrupt_while_interrupting_is_409(sim: Simulator) -> None:
    sim.config.interrupt_winddown = 0.5  # keep the interrupting window open
    async with Wire(sim) as wire:
        chat_id = (await wire.create("busy /sleep 2"))["id"]
        assert (await interrupt(wire, chat_id)).json()["status"] == "interrupting"
        expect_error(await interrupt(wire, chat_id), 409, NOT_INTERRUPTIBLE)
        assert sim.chat(chat_id).status == "interrupting"
    assert [(r.status_before, r.http_status) for r in sim.records.interrupts] == [
        ("running", 200),
        ("interrupting", 409),
    ]


async def test_interrupt_unknown_chat_is_404(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        expect_error(await interrupt(wire, str(uuid.uuid4())), 404, NOT_FOUND)
    assert sim.records.interrupts == []


async def test_interrupt_with_a_queue_runs_the_queue_head(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("slow /sleep 2"))["id"]
        assert (await wire.send(chat_id, "next one")).json()["queued"] is True
        assert (await interrupt(wire, chat_id)).json()["status"] == "interrupting"
        await sim.wait_for_status(chat_id, "waiting")
        assert [(m.role, m.text()) for m in sim.messages(chat_id)] == [
            ("user", "slow /sleep 2"),
            ("user", "next one"),
            ("assistant", 'You said: "next one"'),
        ]
        assert sim.chat(chat_id).queue == []


async def test_interrupt_a_chat_waiting_on_tools(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, calls = await paused_on_tools(sim, wire, 'look /tool lookup {"q": 1}', "lookup")
        [call] = calls
        response = await interrupt(wire, chat_id)
        assert response.status_code == 200, response.text
        # The synthetic results are inserted and the chat goes straight back to running.
        assert response.json()["status"] == "running"

        await sim.wait_for_status(chat_id, "waiting")
        [result] = tool_messages(sim, chat_id)
        assert result == {
            "type": "tool-result",
            "tool_call_id": call["tool_call_id"],
            "tool_name": "lookup",
            "result": INTERRUPTED,
            "is_error": True,
        }
        final = sim.messages(chat_id)[-1]
        assert final.role == "assistant"
        assert final.text() == f'lookup failed "{INTERRUPTED}". You said: "look"'
    [record] = sim.records.tool_results
    assert (record.tool_call_id, record.output, record.is_error, record.synthetic) == (
        call["tool_call_id"],
        INTERRUPTED,
        True,
        True,
    )
    assert [(r.status_before, r.http_status) for r in sim.records.interrupts] == [
        ("requires_action", 200)
    ]


async def test_send_with_interrupt_cancels_pending_tools(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, [call] = await paused_on_tools(sim, wire, "look /tool lookup {}", "lookup")
        response = await wire.send(chat_id, "never mind", busy_behavior="interrupt")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["queued"] is True
        # The synthetic cancellations are returned as rows the send inserted.
        [inserted] = body["messages"]
        assert inserted["role"] == "tool"
        assert inserted["content"][0]["tool_call_id"] == call["tool_call_id"]
        assert inserted["content"][0]["result"] == "Tool execution interrupted by user message"
        assert inserted["content"][0]["is_error"] is True

        await sim.wait_for_status(chat_id, "waiting")
        users = [m.text() for m in sim.messages(chat_id) if m.role == "user"]
        assert users == ["look /tool lookup {}", "never mind"]
        assert sim.messages(chat_id)[-1].text() == 'You said: "never mind"'


async def test_send_with_queue_while_waiting_on_tools_stays_paused(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, _ = await paused_on_tools(sim, wire, "look /tool lookup {}", "lookup")
        body = (await wire.send(chat_id, "afterwards")).json()
        assert body["queued"] is True
        assert body["messages"] == []
        assert sim.chat(chat_id).status == "requires_action"
        assert tool_messages(sim, chat_id) == []


# -- tool results -------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [V2, EXP])
async def test_tool_results_resume_the_turn(sim: Simulator, prefix: str) -> None:
    async with Wire(sim, prefix) as wire:
        chat_id, calls = await paused_on_tools(sim, wire, 'find /tool lookup {"q": 7}', "lookup")
        [call] = calls
        assert call["tool_name"] == "lookup"
        assert call["args"] == {"q": 7}
        assert (await wire.http.get(f"{prefix}/{chat_id}")).json()["status"] == "requires_action"

        output = {"answer": 42, "items": ["a", "b"]}
        response = await submit(
            wire, chat_id, [{"tool_call_id": call["tool_call_id"], "output": output}]
        )
        assert response.status_code == 204, response.text
        assert response.content == b""

        await sim.wait_for_status(chat_id, "waiting")
        [result] = tool_messages(sim, chat_id)
        assert result["tool_call_id"] == call["tool_call_id"]
        assert result["tool_name"] == "lookup"
        assert result["result"] == output
        assert result["is_error"] is False
        final = sim.messages(chat_id)[-1]
        assert (
            final.text() == 'lookup returned {"answer": 42, "items": ["a", "b"]}. You said: "find"'
        )
    [record] = sim.records.tool_results
    assert (record.tool_call_id, record.tool_name, record.output, record.synthetic) == (
        call["tool_call_id"],
        "lookup",
        output,
        False,
    )


async def test_error_results_are_passed_on(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, [call] = await paused_on_tools(sim, wire, "try /tool lookup {}", "lookup")
        response = await submit(
            wire,
            chat_id,
            [{"tool_call_id": call["tool_call_id"], "output": "no such thing", "is_error": True}],
        )
        assert response.status_code == 204
        await sim.wait_for_status(chat_id, "waiting")
        [result] = tool_messages(sim, chat_id)
        assert result["is_error"] is True
        assert sim.messages(chat_id)[-1].text() == 'lookup failed "no such thing". You said: "try"'


async def test_null_output_is_valid_json(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, [call] = await paused_on_tools(sim, wire, "nil /tool lookup {}", "lookup")
        response = await submit(
            wire, chat_id, [{"tool_call_id": call["tool_call_id"], "output": None}]
        )
        assert response.status_code == 204, response.text
        await sim.wait_for_status(chat_id, "waiting")
        assert tool_messages(sim, chat_id)[0]["result"] is None


async def test_tool_results_outside_requires_action_are_409(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        running = (await wire.create("busy /sleep 2"))["id"]
        expect_error(
            await submit(wire, running, [{"tool_call_id": "call_x", "output": 1}]),
            409,
            NOT_WAITING,
            'chat status is "running", expected "requires_action"',
        )
        waiting = (await wire.create("quick"))["id"]
        await sim.wait_for_status(waiting, "waiting")
        body = expect_error(
            await submit(wire, waiting, [{"tool_call_id": "call_x", "output": 1}]), 409, NOT_WAITING
        )
        assert '"waiting"' in body["detail"]
    assert sim.records.tool_results == []


async def test_results_cannot_be_submitted_twice(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, [call] = await paused_on_tools(sim, wire, "once /tool lookup {}", "lookup")
        results = [{"tool_call_id": call["tool_call_id"], "output": "first"}]
        assert (await submit(wire, chat_id, results)).status_code == 204
        # The chat left requires_action: a resubmission is refused.
        expect_error(await submit(wire, chat_id, results), 409, NOT_WAITING)
    assert [r.output for r in sim.records.tool_results] == ["first"]


@pytest.mark.parametrize("results", [[], None, "not a list"])
async def test_empty_results_are_400(sim: Simulator, results: Any) -> None:
    async with Wire(sim) as wire:
        chat_id, _ = await paused_on_tools(sim, wire, "x /tool lookup {}", "lookup")
        expect_error(
            await submit(wire, chat_id, results), 400, "At least one tool result is required."
        )
        missing_key = await wire.http.post(f"{V2}/{chat_id}/tool-results", json={})
        expect_error(missing_key, 400, "At least one tool result is required.")
        assert sim.chat(chat_id).status == "requires_action"


async def test_tool_result_validation(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, calls = await paused_on_tools(
            sim, wire, 'two /tool lookup {"q": 1} /tool fetch {"url": "x"}', "lookup", "fetch"
        )
        assert [c["tool_name"] for c in calls] == ["lookup", "fetch"]
        a, b = (c["tool_call_id"] for c in calls)
        assert a != b

        def ok(call_id: str) -> dict[str, Any]:
            return {"tool_call_id": call_id, "output": {"for": call_id}}

        expect_error(
            await submit(wire, chat_id, [ok(a), ok(a), ok(b)]),
            400,
            "Duplicate tool_call_id in results.",
            f'Duplicate tool call ID "{a}".',
        )
        expect_error(
            await submit(wire, chat_id, [ok(a)]),
            400,
            "Missing tool result.",
            f'Missing result for tool call "{b}".',
        )
        expect_error(
            await submit(wire, chat_id, [ok(a), ok(b), ok("call_unknown")]),
            400,
            "Unexpected tool result.",
            'No pending tool call with ID "call_unknown".',
        )
        expect_error(
            await submit(wire, chat_id, [ok(a), {"tool_call_id": b}]),
            400,
            "Tool result output must be valid JSON.",
            f'Output for tool call "{b}" is not valid JSON.',
        )
        # Nothing was accepted: the chat still waits on both calls.
        assert sim.chat(chat_id).status == "requires_action"
        assert sim.records.tool_results == []
        assert tool_messages(sim, chat_id) == []

        # Answered all at once (in any order), the turn goes on.
        assert (await submit(wire, chat_id, [ok(b), ok(a)])).status_code == 204
        await sim.wait_for_status(chat_id, "waiting")
        results = tool_messages(sim, chat_id)
        assert {r["tool_call_id"]: r["tool_name"] for r in results} == {a: "lookup", b: "fetch"}
        assert {r["tool_call_id"]: r["result"] for r in results} == {a: {"for": a}, b: {"for": b}}


async def test_tool_results_to_an_archived_chat_are_400(sim: Simulator) -> None:
    [chat] = sim.seed(1, archived=True)
    async with Wire(sim) as wire:
        expect_error(
            await submit(wire, str(chat), [{"tool_call_id": "call_x", "output": 1}]),
            400,
            "Cannot submit tool results to an archived chat.",
        )
    assert sim.records.tool_results == []


async def test_tool_results_to_an_unknown_chat_are_404(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        expect_error(
            await submit(wire, str(uuid.uuid4()), [{"tool_call_id": "x", "output": 1}]),
            404,
            NOT_FOUND,
        )


async def test_a_seeded_paused_chat_accepts_results(sim: Simulator) -> None:
    [chat] = sim.seed(1, status="requires_action", tool_name="probe")
    async with Wire(sim) as wire:
        [call] = await pending_calls(wire, str(chat))
        assert call["tool_name"] == "probe"
        response = await submit(
            wire, str(chat), [{"tool_call_id": call["tool_call_id"], "output": 3}]
        )
        assert response.status_code == 204, response.text
        await sim.wait_for_status(chat, "waiting")
        assert sim.messages(chat)[-1].text().startswith("probe returned 3.")


async def test_missed_tool_deadline_times_out_and_the_model_calls_again() -> None:
    async with serve_simulator(fast_config(tool_result_deadline=0.3)) as sim, Wire(sim) as wire:
        chat_id, [first] = await paused_on_tools(
            sim, wire, 'slowpoke /tool lookup {"q": 5}', "lookup"
        )
        # Only the first call should miss its deadline: give the re-call plenty of time.
        sim.config.tool_result_deadline = 30.0

        async with asyncio.timeout(5):
            while True:
                calls = await pending_calls(wire, chat_id)
                if calls and calls[0]["tool_call_id"] != first["tool_call_id"]:
                    break
                await asyncio.sleep(0.02)
        [second] = calls
        assert second["tool_name"] == "lookup"
        assert second["args"] == first["args"] == {"q": 5}
        await sim.wait_for_status(chat_id, "requires_action")

        [timed_out] = tool_messages(sim, chat_id)
        assert timed_out["tool_call_id"] == first["tool_call_id"]
        assert timed_out["result"] == TIMED_OUT
        assert timed_out["is_error"] is True
        [record] = sim.records.tool_results
        assert (record.tool_call_id, record.synthetic, record.output) == (
            first["tool_call_id"],
            True,
            TIMED_OUT,
        )

        # A late answer to the timed-out call is not a pending call any more.
        late = [
            {"tool_call_id": second["tool_call_id"], "output": "fresh"},
            {"tool_call_id": first["tool_call_id"], "output": "stale"},
        ]
        expect_error(
            await submit(wire, chat_id, late),
            400,
            "Unexpected tool result.",
            f'No pending tool call with ID "{first["tool_call_id"]}".',
        )
        response = await submit(
            wire, chat_id, [{"tool_call_id": second["tool_call_id"], "output": "fresh"}]
        )
        assert response.status_code == 204, response.text
        await sim.wait_for_status(chat_id, "waiting")
        assert sim.messages(chat_id)[-1].text() == (
            f'lookup failed "{TIMED_OUT}". lookup returned "fresh". You said: "slowpoke"'
        )
