"""Scripted replies: a natural prompt answered as if it carried directives."""

from __future__ import annotations

from coder_chat.simulator import Simulator

from .wire import Wire


async def test_a_scripted_prompt_is_answered_by_its_directives(sim: Simulator) -> None:
    sim.script("Plan the refund", '/json {"amount_cents": 500}')
    async with Wire(sim) as wire:
        plain = await wire.create("Say hello")
        planned = await wire.create(
            "Plan the refund of order 7",
            unsafe_dynamic_tools=[{"name": "structured_output", "input_schema": {}}],
        )
        async with wire.stream(plain["id"]) as reader:
            await reader.until_status("waiting")
        async with wire.stream(planned["id"]) as reader:
            await reader.until_status("requires_action")
    assert sim.chat(plain["id"]).status == "waiting"
    # The scripted /json makes the model call structured_output with that answer.
    assert sim.chat(planned["id"]).status == "requires_action"


async def test_scripts_over_the_admin_routes(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        base = "/simulator/v1/scripts"
        added = await wire.http.post(base, json={"when": "Plan", "then": "/fail fatal"})
        assert added.json() == [{"when": "Plan", "then": "/fail fatal", "times": None}]
        assert (await wire.http.get(base)).json() == added.json()
        chat = await wire.create("Plan it")
        async with wire.stream(chat["id"]) as reader:
            await reader.until_status("error")
        assert (await wire.http.delete(base)).json() == []
        assert sim.engine.scripts == []


async def test_a_script_with_a_count_is_used_up(sim: Simulator) -> None:
    sim.script("Stall", "/fail fatal", times=1)
    async with Wire(sim) as wire:
        first = await wire.create("Stall here")
        second = await wire.create("Stall again")
        async with wire.stream(first["id"]) as reader:
            await reader.until_status("error")
        async with wire.stream(second["id"]) as reader:
            await reader.until_status("waiting")
    assert sim.engine.scripts == []


async def test_a_sleep_after_a_server_tool_waits_once_the_tool_ran(sim: Simulator) -> None:
    """A long turn whose tool calls are seen while it goes on: the call and its result are
    in the chat while the run still thinks; a sleep before the tool waits before it."""
    async with Wire(sim) as wire:
        after = await wire.create('Look it up /server-tool lookup {"q": "a"} /sleep 30')
        before = await wire.create('Look it up /sleep 30 /server-tool lookup {"q": "a"}')
        async with wire.stream(after["id"]) as reader:
            await reader.until(lambda e: e["type"] == "message" and e["message"]["role"] == "tool")
        assert sim.chat(after["id"]).status == "running"
        assert [m.role for m in sim.messages(before["id"])] == ["user"]
        assert sim.chat(before["id"]).status == "running"
