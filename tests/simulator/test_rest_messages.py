"""Messages over plain HTTP: paging history, sending, the queue (wire reference 3.6, 3.7, 3.10)."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest

from coder_chat.simulator import Simulator

from .wire import EXP, NOT_FOUND, V2, Wire, expect_error, text_of


def ids(page: dict[str, Any]) -> list[int]:
    return [m["id"] for m in page["messages"]]


async def three_turns(sim: Simulator, wire: Wire) -> tuple[str, list[int]]:
    """A settled chat with six visible messages; returns its id and the ids, oldest first."""
    chat_id = (await wire.create("one"))["id"]
    await sim.wait_for_status(chat_id, "waiting")
    for text in ("two", "three"):
        response = await wire.send(chat_id, text)
        assert response.status_code == 200, response.text
        await sim.wait_for_status(chat_id, "waiting")
    oldest_first = [m.id for m in sim.messages(chat_id)]
    assert len(oldest_first) == 6
    return chat_id, oldest_first


# -- GET messages -------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [V2, EXP])
async def test_messages_are_newest_first_by_default(sim: Simulator, prefix: str) -> None:
    async with Wire(sim, prefix) as wire:
        chat_id, oldest_first = await three_turns(sim, wire)
        page = await wire.messages(chat_id)
        assert ids(page) == oldest_first[::-1]
        assert page["has_more"] is False
        assert page["queued_messages"] == []
        assert [m["role"] for m in page["messages"]] == ["assistant", "user"] * 3
        assert [text_of(m) for m in page["messages"][::2]] == [
            'You said: "three"',
            'You said: "two"',
            'You said: "one"',
        ]
        newest = page["messages"][0]
        assert newest["chat_id"] == chat_id
        assert newest["usage"]["total_tokens"] > 0
        assert {"id", "chat_id", "created_at", "role", "content"} <= set(newest)


async def test_limit_and_has_more(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, oldest_first = await three_turns(sim, wire)
        newest_first = oldest_first[::-1]
        one = await wire.messages(chat_id, limit=1)
        assert ids(one) == newest_first[:1]
        assert one["has_more"] is True
        five = await wire.messages(chat_id, limit=5)
        assert ids(five) == newest_first[:5]
        assert five["has_more"] is True
        six = await wire.messages(chat_id, limit=6)
        assert ids(six) == newest_first
        assert six["has_more"] is False
        two_hundred = await wire.messages(chat_id, limit=200)
        assert ids(two_hundred) == newest_first
        assert two_hundred["has_more"] is False


async def test_default_limit_is_50(sim: Simulator) -> None:
    # 25 server tools make 50 rows, plus the prompt and the final answer.
    prompt = " ".join(f"/server-tool step{i} {{}}" for i in range(25)) + " go"
    async with Wire(sim) as wire:
        chat_id = (await wire.create(prompt))["id"]
        await sim.wait_for_status(chat_id, "waiting")
        oldest_first = [m.id for m in sim.messages(chat_id)]
        assert len(oldest_first) == 52
        page = await wire.messages(chat_id)
        assert ids(page) == oldest_first[::-1][:50]
        assert page["has_more"] is True
        rest = await wire.messages(chat_id, before_id=ids(page)[-1])
        assert ids(rest) == oldest_first[1::-1]
        assert rest["has_more"] is False


@pytest.mark.parametrize("limit", ["0", "201", "-1", "1000"])
async def test_limit_out_of_range_is_400(sim: Simulator, limit: str) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("hi"))["id"]
        response = await wire.http.get(f"{V2}/{chat_id}/messages", params={"limit": limit})
        expect_error(response, 400, "Invalid limit parameter (1-200).")


async def test_non_numeric_cursors_are_400(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("hi"))["id"]
        for params in ({"limit": "ten"}, {"before_id": "x"}, {"after_id": "1.5"}):
            response = await wire.http.get(f"{V2}/{chat_id}/messages", params=params)
            assert response.status_code == 400, (params, response.text)


async def test_before_id_pages_backwards_newest_first(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, oldest_first = await three_turns(sim, wire)
        page = await wire.messages(chat_id, before_id=oldest_first[4])
        assert ids(page) == oldest_first[:4][::-1]
        assert page["has_more"] is False
        limited = await wire.messages(chat_id, before_id=oldest_first[4], limit=3)
        assert ids(limited) == [oldest_first[3], oldest_first[2], oldest_first[1]]
        assert limited["has_more"] is True
        assert ids(await wire.messages(chat_id, before_id=oldest_first[0])) == []


async def test_after_id_alone_pages_forwards_ascending(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, oldest_first = await three_turns(sim, wire)
        page = await wire.messages(chat_id, after_id=oldest_first[1])
        assert ids(page) == oldest_first[2:]
        assert page["has_more"] is False
        limited = await wire.messages(chat_id, after_id=oldest_first[1], limit=2)
        assert ids(limited) == oldest_first[2:4]
        assert limited["has_more"] is True
        # A poller advances its cursor without gaps.
        seen: list[int] = []
        cursor = 0
        while True:
            step = await wire.messages(chat_id, after_id=cursor, limit=4)
            seen += ids(step)
            if not step["has_more"]:
                break
            cursor = ids(step)[-1]
        assert seen == oldest_first
        assert ids(await wire.messages(chat_id, after_id=oldest_first[-1])) == []


async def test_after_and_before_together(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id, oldest_first = await three_turns(sim, wire)
        window = await wire.messages(chat_id, after_id=oldest_first[0], before_id=oldest_first[4])
        assert ids(window) == oldest_first[1:4][::-1]
        for after, before in (
            (oldest_first[3], oldest_first[3]),
            (oldest_first[4], oldest_first[1]),
        ):
            response = await wire.http.get(
                f"{V2}/{chat_id}/messages", params={"after_id": after, "before_id": before}
            )
            expect_error(response, 400, "after_id must be less than before_id.")


async def test_message_ids_are_global_across_chats(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        first = (await wire.create("first chat"))["id"]
        second = (await wire.create("second chat"))["id"]
        await sim.wait_for_status(first, "waiting")
        await sim.wait_for_status(second, "waiting")
        assert (await wire.send(first, "first chat again")).status_code == 200
        await sim.wait_for_status(first, "waiting")

        first_ids = sorted(ids(await wire.messages(first)))
        second_ids = sorted(ids(await wire.messages(second)))
        assert len(first_ids) == 4
        assert len(second_ids) == 2
        assert not set(first_ids) & set(second_ids), "ids are unique across chats"
        # The other chat's rows sit between this chat's ids: one chat's ids have gaps.
        assert any(first_ids[0] < i < first_ids[-1] for i in second_ids)
        assert any(b - a > 1 for a, b in itertools.pairwise(first_ids))
        # And a foreign id works as a cursor all the same.
        between = next(i for i in second_ids if first_ids[0] < i < first_ids[-1])
        after = await wire.messages(first, after_id=between)
        assert ids(after) == [i for i in first_ids if i > between]


async def test_queued_messages_only_on_the_cursorless_page(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("busy /sleep 2"))["id"]
        sent = await wire.send(chat_id, "later")
        assert sent.json()["queued"] is True
        queued = sent.json()["queued_message"]

        first_page = await wire.messages(chat_id)
        assert first_page["queued_messages"] == [queued]
        assert (await wire.messages(chat_id, limit=1))["queued_messages"] == [queued]
        user_id = ids(first_page)[0]
        assert (await wire.messages(chat_id, after_id=0))["queued_messages"] == []
        assert (await wire.messages(chat_id, before_id=user_id + 1))["queued_messages"] == []
        assert (await wire.messages(chat_id, after_id=0, before_id=user_id + 1))[
            "queued_messages"
        ] == []


async def test_messages_of_an_unknown_chat_is_404(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        expect_error(await wire.http.get(f"{V2}/{uuid.uuid4()}/messages"), 404, NOT_FOUND)
        expect_error(await wire.send(str(uuid.uuid4()), "hello?"), 404, NOT_FOUND)


# -- send ---------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [V2, EXP])
async def test_send_to_an_idle_chat_is_admitted_directly(sim: Simulator, prefix: str) -> None:
    async with Wire(sim, prefix) as wire:
        chat_id = (await wire.create("hello"))["id"]
        await sim.wait_for_status(chat_id, "waiting")
        before = max(m.id for m in sim.messages(chat_id))

        async with wire.stream(chat_id, after_id=before) as reader:
            await reader.until_status("waiting")
            response = await wire.send(chat_id, "  follow up  ")
            assert response.status_code == 200, response.text
            # Direct admission moves the chat to running; the turn then settles.
            await reader.until_status("running")
            await reader.until_status("waiting")
        body = response.json()
        assert body["queued"] is False
        message = body["message"]
        assert message["role"] == "user"
        assert message["chat_id"] == chat_id
        assert message["content"] == [{"type": "text", "text": "follow up"}]
        assert message["id"] > before
        assert body["messages"] == [message]
        assert "queued_message" not in body

        page = await wire.messages(chat_id, after_id=before)
        assert ids(page) == [message["id"], ids(page)[1]]
        assert text_of(page["messages"][1]) == 'You said: "follow up"'


async def test_send_to_an_errored_chat_starts_a_new_turn(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("break /fail retryable"))["id"]
        await sim.wait_for_status(chat_id, "error")
        assert sim.chat(chat_id).to_wire()["last_error"]["kind"] == "overloaded"
        body = (await wire.send(chat_id, "try again")).json()
        assert body["queued"] is False
        await sim.wait_for_status(chat_id, "waiting")
        assert "last_error" not in sim.chat(chat_id).to_wire()
        assert sim.messages(chat_id)[-1].text() == 'You said: "try again"'


async def test_send_while_running_is_queued(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("busy /sleep 2"))["id"]
        response = await wire.send(chat_id, "after that")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["queued"] is True
        assert "message" not in body
        queued = body["queued_message"]
        assert isinstance(queued["id"], int)
        assert queued["chat_id"] == chat_id
        assert queued["content"] == [{"type": "text", "text": "after that"}]
        assert "created_at" in queued
        assert body["messages"] == []

        chat = await wire.http.get(f"{V2}/{chat_id}")
        assert chat.json()["status"] == "running"
        assert [q.id for q in sim.chat(chat_id).queue] == [queued["id"]]
        # Queued prompts are not history yet.
        assert [m["role"] for m in (await wire.messages(chat_id))["messages"]] == ["user"]


async def test_queue_holds_at_most_20(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("busy /sleep 2"))["id"]
        queue_ids = []
        for index in range(20):
            body = (await wire.send(chat_id, f"queued {index}")).json()
            assert body["queued"] is True
            queue_ids.append(body["queued_message"]["id"])
        assert queue_ids == sorted(queue_ids)
        expect_error(
            await wire.send(chat_id, "one too many"),
            429,
            "Message queue is full.",
            "Maximum 20 messages can be queued.",
        )
        page = await wire.messages(chat_id)
        assert [q["id"] for q in page["queued_messages"]] == queue_ids


async def test_queued_prompts_are_promoted_in_order(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("first /sleep 0.3"))["id"]
        for text in ("second", "third"):
            body = (await wire.send(chat_id, text)).json()
            assert body["queued"] is True, "the first turn must still be running"
        assert await wire.settled(chat_id) == [
            ("user", "first /sleep 0.3"),
            ("assistant", 'You said: "first"'),
            ("user", "second"),
            ("assistant", 'You said: "second"'),
            ("user", "third"),
            ("assistant", 'You said: "third"'),
        ]
        assert (await wire.messages(chat_id))["queued_messages"] == []


async def model_configs(wire: Wire) -> tuple[str, str]:
    """The default model config's id and another's."""
    configs = (await wire.http.get(f"{EXP}/model-configs")).json()
    default = next(c["id"] for c in configs if c["is_default"])
    other = next(c["id"] for c in configs if not c["is_default"])
    return default, other


async def last_model(wire: Wire, chat_id: str) -> str | None:
    response = await wire.http.get(f"{wire.prefix}/{chat_id}")
    assert response.status_code == 200, response.text
    value: str | None = response.json().get("last_model_config_id")
    return value


async def test_a_message_sent_with_another_model_moves_the_chat_to_it(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        default, other = await model_configs(wire)
        chat_id = (await wire.create("hello"))["id"]
        await sim.wait_for_status(chat_id, "waiting")
        assert await last_model(wire, chat_id) == default

        sent = await wire.send(chat_id, "switch", model_config_id=other)
        assert sent.status_code == 200 and sent.json()["queued"] is False, sent.text
        assert await last_model(wire, chat_id) == other  # the turn it starts runs on it
        await sim.wait_for_status(chat_id, "waiting")

        assert (await wire.send(chat_id, "no model named")).status_code == 200
        await sim.wait_for_status(chat_id, "waiting")
        assert await last_model(wire, chat_id) == other  # kept, not reset to the default

        expect_error(
            await wire.send(chat_id, "unknown", model_config_id=str(uuid.uuid4())),
            400,
            "Invalid model config ID.",
        )
        assert await last_model(wire, chat_id) == other

        assert (await wire.send(chat_id, "back", model_config_id=default)).status_code == 200
        assert await last_model(wire, chat_id) == default


async def test_a_queued_message_moves_the_chat_to_its_model_when_its_turn_starts(
    sim: Simulator,
) -> None:
    async with Wire(sim) as wire:
        default, other = await model_configs(wire)
        chat_id = (await wire.create("busy /sleep 1"))["id"]
        body = (await wire.send(chat_id, "later", model_config_id=other)).json()
        assert body["queued"] is True, "the first turn must still be running"
        assert body["queued_message"]["model_config_id"] == other
        assert (await wire.messages(chat_id))["queued_messages"] == [body["queued_message"]]
        assert await last_model(wire, chat_id) == default  # the running turn's model

        await sim.wait_for_status(chat_id, "waiting")  # the queued prompt ran, then settled
        assert sim.messages(chat_id)[-1].text() == 'You said: "later"'
        assert await last_model(wire, chat_id) == other


async def test_send_to_an_archived_chat_is_400(sim: Simulator) -> None:
    [chat] = sim.seed(1, archived=True)
    async with Wire(sim) as wire:
        message = "Cannot send messages to an archived chat."
        expect_error(await wire.send(str(chat), "hello"), 400, message)
        # Checked before the body is read: even an invalid body gets this answer.
        broken = await wire.http.post(f"{V2}/{chat}/messages", json={"content": []})
        expect_error(broken, 400, message)
        bad_behavior = await wire.send(str(chat), "hello", busy_behavior="never")
        expect_error(bad_behavior, 400, message)
    assert len(sim.messages(chat)) == 2


@pytest.mark.parametrize("behavior", ["later", "QUEUE", "interrupt-now", 1])
async def test_invalid_busy_behavior_is_400(sim: Simulator, behavior: object) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("hi"))["id"]
        await sim.wait_for_status(chat_id, "waiting")
        expect_error(
            await wire.send(chat_id, "again", busy_behavior=behavior),
            400,
            "Invalid busy_behavior value.",
            'Must be "queue" or "interrupt".',
        )
        assert len(sim.messages(chat_id)) == 2


async def test_explicit_queue_behavior_is_accepted(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("busy /sleep 2"))["id"]
        body = (await wire.send(chat_id, "later", busy_behavior="queue")).json()
        assert body["queued"] is True
        assert sim.chat(chat_id).status == "running"


async def test_send_content_rules(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("hi"))["id"]
        await sim.wait_for_status(chat_id, "waiting")
        url = f"{V2}/{chat_id}/messages"
        expect_error(
            await wire.http.post(url, json={}),
            400,
            "Content is required.",
            "Content cannot be empty.",
        )
        expect_error(
            await wire.http.post(url, json={"content": [{"type": "text", "text": " "}]}),
            400,
            "Invalid input part.",
            "content[0].text cannot be empty.",
        )
        expect_error(
            await wire.http.post(url, json={"content": [{"type": "hook-notice", "text": "x"}]}),
            400,
            "Invalid input part.",
            'content[0].type "hook-notice" is not supported.',
        )
        expect_error(
            await wire.send(chat_id, "hi", model_config_id=str(uuid.uuid4())),
            400,
            "Invalid model config ID.",
        )
        assert len(sim.messages(chat_id)) == 2
        assert sim.chat(chat_id).status == "waiting"


async def test_busy_behavior_interrupt_while_running(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("slow /sleep 2"))["id"]
        async with wire.stream(chat_id) as reader:
            await reader.until_status("running")
            response = await wire.send(chat_id, "now instead", busy_behavior="interrupt")
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["queued"] is True
            assert body["queued_message"]["content"] == [{"type": "text", "text": "now instead"}]
            await reader.until_status("interrupting")
        assert await wire.settled(chat_id) == [
            ("user", "slow /sleep 2"),
            ("user", "now instead"),
            ("assistant", 'You said: "now instead"'),
        ]


# -- queue management ---------------------------------------------------------------------


async def test_delete_queued_messages(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("busy /sleep 2"))["id"]
        first = (await wire.send(chat_id, "drop me")).json()["queued_message"]["id"]
        second = (await wire.send(chat_id, "drop me too")).json()["queued_message"]["id"]
        url = f"{V2}/{chat_id}/queue"

        response = await wire.http.delete(f"{url}/{first}")
        assert response.status_code == 204
        assert response.content == b""
        assert [q["id"] for q in (await wire.messages(chat_id))["queued_messages"]] == [second]

        expect_error(await wire.http.delete(f"{url}/{first}"), 404, "Queued message not found.")
        expect_error(
            await wire.http.delete(f"{url}/{second + 1000}"), 404, "Queued message not found."
        )
        assert (await wire.http.delete(f"{url}/{second}")).status_code == 204
        expect_error(
            await wire.http.delete(f"{url}/{second}"), 409, "Chat has no queued messages to delete."
        )

        # Deleted prompts never run.
        assert (await wire.http.post(f"{V2}/{chat_id}/interrupt")).status_code == 200
        await sim.wait_for_status(chat_id, "waiting")
        assert [m.text() for m in sim.messages(chat_id) if m.role == "user"] == ["busy /sleep 2"]


async def test_delete_from_an_idle_chat_is_409(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("hi"))["id"]
        await sim.wait_for_status(chat_id, "waiting")
        expect_error(
            await wire.http.delete(f"{V2}/{chat_id}/queue/1"),
            409,
            "Chat has no queued messages to delete.",
        )


async def test_queue_ids_are_not_message_ids(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("first /sleep 0.3"))["id"]
        first_user = ids(await wire.messages(chat_id))[0]
        queued = (await wire.send(chat_id, "second")).json()["queued_message"]
        # Queue ids come from their own counter: the deployment's first queue entry is 1
        # although message ids are already past it.
        assert queued["id"] == 1
        assert first_user > 1
        await sim.wait_for_status(chat_id, "waiting")
        promoted = next(m for m in sim.messages(chat_id) if m.text() == "second")
        # The promoted prompt is a new user message with a new (message) id.
        assert promoted.role == "user"
        assert promoted.content == queued["content"]
        assert promoted.id > first_user
