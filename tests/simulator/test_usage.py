"""Usage on each assistant message, as Coder reports it (wire reference 2.4)."""

from __future__ import annotations

from typing import Any

from coder_chat.simulator import Simulator
from coder_chat.simulator.usage import PREAMBLE_TOKENS

from .wire import Wire, declare

THANKS = "and now say thanks"


async def assistant_usages(wire: Wire, chat_id: str) -> list[dict[str, Any]]:
    page = await wire.messages(chat_id)
    return [m["usage"] for m in reversed(page["messages"]) if m["role"] == "assistant"]


async def test_each_step_spends_output_and_reads_a_growing_conversation(sim: Simulator) -> None:
    """A step that only calls a tool still writes tokens; each later step reads what came
    before it; a later turn reads the earlier ones from the cache, not as fresh input."""
    async with Wire(sim) as wire:
        created = await wire.create('look it up /server-tool search {"q": "refund policy"}')
        chat_id = str(created["id"])
        await sim.wait_for_status(chat_id, "waiting")
        calling, answering = await assistant_usages(wire, chat_id)
        assert calling["output_tokens"] > 0  # the call itself is written by the model
        assert answering["input_tokens"] > calling["input_tokens"]
        assert calling["cache_read_tokens"] == answering["cache_read_tokens"]  # the same turn

        await wire.send(chat_id, THANKS)
        await sim.wait_for_status(chat_id, "waiting")
        *_, second_turn = await assistant_usages(wire, chat_id)
    # Turn 1 is read from the cache now; only turn 2's prompt is fresh input.
    assert (
        second_turn["cache_read_tokens"] > answering["cache_read_tokens"] + calling["output_tokens"]
    )
    assert second_turn["input_tokens"] == PREAMBLE_TOKENS + 4  # THANKS, a word a token
    for usage in (calling, answering, second_turn):
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        assert "total_cost_micros" not in usage  # no price set: no cost reported


async def test_a_priced_simulator_reports_each_steps_cost(sim: Simulator) -> None:
    sim.config.cost_micros_per_token = 3
    async with Wire(sim) as wire:
        chat_id = await wire.create_settled("what does it cost")
        [usage] = await assistant_usages(wire, chat_id)
    read_and_written = usage["total_tokens"] + usage["cache_read_tokens"]
    assert usage["total_cost_micros"] == 3 * read_and_written > 0


async def test_a_step_that_only_calls_client_tools_spends_output_tokens(sim: Simulator) -> None:
    """The reference client's own end-to-end test asserts every step consumes output."""
    async with Wire(sim) as wire:
        created = await wire.create('/tool lookup {"city": "Oslo"}', **declare("lookup"))
        chat_id = str(created["id"])
        await sim.wait_for_status(chat_id, "requires_action")
        [calling] = await assistant_usages(wire, chat_id)
    assert calling["output_tokens"] > 0
