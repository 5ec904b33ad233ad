"""The simulated user's usage limit and a chat's cost (wire reference 2.4, 3.1, 3.7)."""

from __future__ import annotations

from datetime import datetime, timedelta

from coder_chat import ChatClient, CoderUsageLimitError
from coder_chat.simulator import Simulator

from .wire import Wire


async def test_past_the_limit_new_chats_and_prompts_are_refused_with_coders_figures(
    sim: Simulator,
) -> None:
    sim.config.cost_micros_per_token = 1000
    async with Wire(sim) as wire:
        chat_id = await wire.create_settled("spend something")
        spent = sum(
            m.usage["total_cost_micros"]
            for m in sim.chat(chat_id).messages
            if m.role == "assistant" and m.usage
        )
        sim.config.usage_limit_micros = spent  # reached, not passed: refused all the same
        refused = await wire.send(chat_id, "and more")
        created = await wire.http.post(wire.prefix, json=wire.create_body("a new chat"))
    assert (refused.status_code, created.status_code) == (409, 409)
    body = refused.json()
    assert body["message"] == "Chat usage limit exceeded."
    assert (body["spent_micros"], body["limit_micros"]) == (spent, spent)
    resets = datetime.fromisoformat(body["resets_at"])
    assert resets - sim.engine.period_start == timedelta(seconds=sim.config.usage_period)
    assert len(sim.chat(chat_id).messages) == 3  # the system prompt, the prompt, its answer


async def test_the_client_reads_the_refusal_into_its_own_error(sim: Simulator) -> None:
    sim.config.cost_micros_per_token = 1000
    sim.config.usage_limit_micros = 1
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        chat = await client.create_chat(organization_id=str(sim.organization_id), content="hi")
        await sim.wait_for_status(str(chat.id), "waiting")
        try:
            await client.send_message(str(chat.id), "again")
        except CoderUsageLimitError as exc:
            refused = exc
        else:
            raise AssertionError("the send past the limit was not refused")
    assert refused.status == 409 and refused.limit_micros == 1
    assert refused.spent_micros is not None and refused.spent_micros > 1
    assert refused.resets_at is not None and refused.resets_at > sim.engine.period_start


async def test_a_running_turn_past_the_limit_ends_in_a_usage_limit_error(sim: Simulator) -> None:
    """The limit is checked before each model step: a turn whose tool step spent past it
    ends there, before its answer."""
    sim.config.cost_micros_per_token = 1000
    sim.config.usage_limit_micros = 1
    async with Wire(sim) as wire:
        created = await wire.create('look it up /server-tool search {"q": "refunds"}')
        chat_id = str(created["id"])
        chat = await sim.wait_for_status(chat_id, "error")
    assert chat.last_error is not None
    assert (chat.last_error["kind"], chat.last_error["retryable"]) == ("usage_limit", False)
    assert chat.last_error["message"] == "Chat usage limit exceeded."
    steps = [m for m in chat.messages if m.role == "assistant"]
    assert len(steps) == 1  # the tool call; its answer never came


async def test_a_chats_cost_sums_its_messages(sim: Simulator) -> None:
    sim.config.cost_micros_per_token = 3
    async with Wire(sim) as wire:
        chat_id = await wire.create_settled('look it up /server-tool search {"q": "refunds"}')
        response = await wire.http.get(f"{wire.prefix}/{chat_id}/cost")
    assert response.status_code == 200, response.text
    cost = response.json()
    usages = [m.usage or {} for m in sim.chat(chat_id).messages if m.role == "assistant"]
    assert cost["total_cost_micros"] == sum(u["total_cost_micros"] for u in usages) > 0
    assert (cost["priced_message_count"], cost["unpriced_message_count"]) == (2, 0)
    assert cost["total_output_tokens"] == sum(u["output_tokens"] for u in usages)
    assert cost["chat_id"] == chat_id and cost["children"] == []
