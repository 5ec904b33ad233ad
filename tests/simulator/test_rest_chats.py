"""The chat resource over plain HTTP: create, get, list, update (wire reference 3.2-3.5, 9)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from coder_chat.simulator import Simulator

from .wire import EXP, NOT_FOUND, V2, Wire, expect_error

ARCHIVE_ACTIVE = "Cannot archive an active chat. Interrupt or wait for the chat to finish first."


async def get_chat(wire: Wire, chat_id: str) -> dict[str, Any]:
    response = await wire.http.get(f"{wire.prefix}/{chat_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def list_ids(wire: Wire, **params: Any) -> list[str]:
    response = await wire.http.get(wire.prefix, params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    assert isinstance(body, list), "the chat list is a bare JSON array"
    return [c["id"] for c in body]


async def patch(wire: Wire, chat_id: str, body: dict[str, Any]) -> httpx.Response:
    return await wire.http.patch(f"{wire.prefix}/{chat_id}", json=body)


# -- create -------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [V2, EXP])
async def test_create_answers_201_with_a_running_chat(sim: Simulator, prefix: str) -> None:
    async with Wire(sim, prefix) as wire:
        response = await wire.http.post(prefix, json=wire.create_body("hello there"))
        assert response.status_code == 201, response.text
        chat = response.json()
        assert chat["status"] == "running"
        uuid.UUID(chat["id"])
        assert chat["organization_id"] == str(sim.organization_id)
        assert chat["owner_id"] == str(sim.config.owner_id)
        assert chat["root_chat_id"] == chat["id"]
        assert chat["title"] == "hello there"
        assert chat["archived"] is False
        assert chat["client_type"] == "api"
        assert chat["plan_mode"] == ""
        assert chat["labels"] == {}
        assert chat["mcp_server_ids"] == []
        assert chat["children"] == []
        assert chat["files"] == []
        # The first turn starts at once and settles on its own.
        settled = await sim.wait_for_status(chat["id"], "waiting")
        assert [m.role for m in settled.visible_messages()] == ["user", "assistant"]
        assert settled.visible_messages()[1].text() == 'You said: "hello there"'


async def test_both_prefixes_serve_the_same_chats(sim: Simulator) -> None:
    async with Wire(sim, V2) as v2, Wire(sim, EXP) as exp:
        made_on_v2 = await v2.create("made on v2")
        made_on_exp = await exp.create("made on experimental")
        assert (await get_chat(exp, made_on_v2["id"]))["title"] == "made on v2"
        assert (await get_chat(v2, made_on_exp["id"]))["title"] == "made on experimental"
        assert (
            set(await list_ids(v2))
            == set(await list_ids(exp))
            == {
                made_on_v2["id"],
                made_on_exp["id"],
            }
        )


async def test_create_derives_the_title_from_the_first_prompt(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        long_words = await wire.create("one two three four five six seven eight")
        assert long_words["title"] == "one two three four five six"
        one_long_word = await wire.create("x" * 120)
        assert one_long_word["title"] == "x" * 80


async def test_create_trims_text_parts(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat = await wire.create("   padded prompt \n ")
        page = await wire.messages(chat["id"])
        user = page["messages"][-1]
        assert user["role"] == "user"
        assert user["content"] == [{"type": "text", "text": "padded prompt"}]


async def test_create_requires_the_organization(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        body = wire.create_body("hi")
        del body["organization_id"]
        expect_error(await wire.http.post(V2, json=body), 400, "organization_id is required.")
        other = wire.create_body("hi", organization_id=str(uuid.uuid4()))
        expect_error(
            await wire.http.post(V2, json=other),
            403,
            "You are not a member of the specified organization.",
        )
        malformed = wire.create_body("hi", organization_id="not-a-uuid")
        assert (await wire.http.post(V2, json=malformed)).status_code == 400
    assert sim.chats() == []


@pytest.mark.parametrize(
    ("content", "message", "detail"),
    [
        (None, "Content is required.", "Content cannot be empty."),
        ([], "Content is required.", "Content cannot be empty."),
        (
            [{"type": "text", "text": "   "}],
            "Invalid input part.",
            "content[0].text cannot be empty.",
        ),
        (
            [{"type": "text", "text": "ok"}, {"type": "image", "url": "https://x"}],
            "Invalid input part.",
            'content[1].type "image" is not supported.',
        ),
        (
            [{"type": "file", "file_id": "00000000-0000-0000-0000-00000000f11e"}],
            "Invalid input part.",
            "content[0].file_id references a file that does not exist.",
        ),
    ],
)
async def test_create_content_rules(
    sim: Simulator, content: list[dict[str, Any]] | None, message: str, detail: str
) -> None:
    async with Wire(sim) as wire:
        body: dict[str, Any] = {"organization_id": str(sim.organization_id)}
        if content is not None:
            body["content"] = content
        expect_error(await wire.http.post(V2, json=body), 400, message, detail)
    assert sim.chats() == []


async def test_system_prompt_is_capped_at_10000_characters(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        too_long = wire.create_body("hi", system_prompt="s" * 10_001)
        expect_error(
            await wire.http.post(V2, json=too_long), 400, "System prompt exceeds maximum length."
        )
        assert sim.chats() == []
        chat = await wire.create("hi", system_prompt="s" * 10_000)
        await sim.wait_for_status(chat["id"], "waiting")
        # The system prompt is a model-only row: never listed.
        page = await wire.messages(chat["id"])
        assert [m["role"] for m in page["messages"]] == ["assistant", "user"]


async def test_create_with_valid_labels_at_the_limits(sim: Simulator) -> None:
    labels = {f"k{i}": f"v{i}" for i in range(48)}
    labels["a" * 64] = "b" * 256
    labels["Team.name_x/y-z"] = "a value with spaces: and colons"
    assert len(labels) == 50
    async with Wire(sim) as wire:
        chat = await wire.create("labelled", labels=labels)
        assert chat["labels"] == labels
        assert (await get_chat(wire, chat["id"]))["labels"] == labels


@pytest.mark.parametrize(
    ("labels", "field"),
    [
        ({"-leading-dash": "v"}, "labels.-leading-dash"),
        ({".dot": "v"}, "labels..dot"),
        ({"has space": "v"}, "labels.has space"),
        ({"colon:key": "v"}, "labels.colon:key"),
        ({"": "v"}, "labels."),
        ({"k" * 65: "v"}, "labels." + "k" * 65),
        ({"k": ""}, "labels.k"),
        ({"k": "v" * 257}, "labels.k"),
        ({"k": "é" * 129}, "labels.k"),  # 258 bytes in 129 characters
        ({"k": 5}, "labels.k"),
        ({f"k{i}": "v" for i in range(51)}, "labels"),
    ],
)
async def test_create_rejects_invalid_labels(
    sim: Simulator, labels: dict[str, Any], field: str
) -> None:
    async with Wire(sim) as wire:
        body = expect_error(
            await wire.http.post(V2, json=wire.create_body("hi", labels=labels)),
            400,
            "Invalid labels.",
        )
        validations = body["validations"]
        assert validations, "each bad label is explained"
        assert field in [v["field"] for v in validations]
        assert all(v["detail"] for v in validations)
    assert sim.chats() == []


async def test_invalid_labels_are_each_reported(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        bad = {"ok": "fine", "-a": "v", "b": ""}
        body = expect_error(
            await wire.http.post(V2, json=wire.create_body("hi", labels=bad)),
            400,
            "Invalid labels.",
        )
        fields = {v["field"] for v in body["validations"]}
        assert fields == {"labels.-a", "labels.b"}


def tools(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "description": f"tool {n}", "input_schema": {}} for n in names]


async def test_dynamic_tool_rules(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        many = tools(*(f"t{i}" for i in range(251)))
        expect_error(
            await wire.http.post(V2, json=wire.create_body("hi", unsafe_dynamic_tools=many)),
            400,
            "Too many dynamic tools.",
            "Maximum 250 dynamic tools per chat.",
        )
        expect_error(
            await wire.http.post(
                V2, json=wire.create_body("hi", unsafe_dynamic_tools=[*tools("a"), {"name": ""}])
            ),
            400,
            "Dynamic tool name must not be empty.",
        )
        expect_error(
            await wire.http.post(
                V2, json=wire.create_body("hi", unsafe_dynamic_tools=tools("a", "b", "a"))
            ),
            400,
            "Duplicate dynamic tool name.",
            'Tool "a" appears more than once.',
        )
        assert sim.chats() == []
        chat = await wire.create("hi", unsafe_dynamic_tools=many[:250])
        assert len(sim.chat(chat["id"]).dynamic_tools) == 250


@pytest.mark.parametrize(
    ("field", "taken", "refused", "message"),
    [
        # None: the field left out (client_type's default is "api").
        ("client_type", {None: "api", "ui": "ui", "api": "api"}, "cli", "Invalid client_type."),
        ("plan_mode", {"plan": "plan", "": ""}, "build", "Invalid plan_mode value."),
    ],
)
async def test_a_create_field_takes_its_values_and_refuses_others(
    sim: Simulator, field: str, taken: dict[str | None, str], refused: str, message: str
) -> None:
    async with Wire(sim) as wire:
        for given, stored in taken.items():
            extra = {} if given is None else {field: given}
            assert (await wire.create("hi", **extra))[field] == stored
        expect_error(
            await wire.http.post(V2, json=wire.create_body("hi", **{field: refused})),
            400,
            message,
        )
        assert len(sim.chats()) == len(taken)


async def test_workspace_binding(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        bound = await wire.create("hi", workspace_id=str(sim.workspace_id))
        assert bound["workspace_id"] == str(sim.workspace_id)
        unbound = await wire.create("hi")
        assert "workspace_id" not in unbound or unbound["workspace_id"] is None
        for unknown in (str(uuid.uuid4()), "not-a-uuid"):
            expect_error(
                await wire.http.post(V2, json=wire.create_body("hi", workspace_id=unknown)),
                400,
                "Workspace not found or you do not have access to this resource",
            )
        assert len(sim.chats()) == 2


async def test_model_config_selection(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        listed = await wire.http.get(f"{EXP}/model-configs")
        assert listed.status_code == 200
        config_id = listed.json()[-1]["id"]
        chat = await wire.create("hi", model_config_id=config_id)
        assert chat["last_model_config_id"] == config_id
        expect_error(
            await wire.http.post(
                V2, json=wire.create_body("hi", model_config_id=str(uuid.uuid4()))
            ),
            400,
            "Invalid model config ID.",
        )
        assert len(sim.chats()) == 1


async def test_a_chat_created_without_a_model_carries_the_default_one(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        configs = (await wire.http.get(f"{EXP}/model-configs")).json()
        default = [c["id"] for c in configs if c["is_default"]]
        assert len(default) == 1 and len(configs) > 1
        chat = await wire.create("hi")
        assert chat["last_model_config_id"] == default[0]
        assert (await get_chat(wire, chat["id"]))["last_model_config_id"] == default[0]
        listed = (await wire.http.get(V2)).json()
        assert [c["last_model_config_id"] for c in listed] == [default[0]]


async def test_mcp_server_selection(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        known = str(sim.mcp_server_id)
        chat = await wire.create("hi", mcp_server_ids=[known])
        assert chat["mcp_server_ids"] == [known]
        unknown = str(uuid.uuid4())
        body = expect_error(
            await wire.http.post(V2, json=wire.create_body("hi", mcp_server_ids=[known, unknown])),
            400,
            "One or more MCP server IDs are invalid or disabled",
        )
        assert unknown in body["detail"]
        assert known not in body["detail"]
        assert len(sim.chats()) == 1


async def test_create_body_is_capped_at_256_kib(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        big = wire.create_body("x" * (256 * 1024))
        response = await wire.http.post(V2, json=big)
        assert response.status_code == 413, response.text
        assert sim.chats() == []
        fits = await wire.create("y" * (250 * 1024))
        assert fits["status"] == "running"


async def test_create_rejects_a_body_that_is_not_a_json_object(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        broken = await wire.http.post(
            V2, content=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert broken.status_code == 400
        array = await wire.http.post(V2, json=[wire.create_body("hi")])
        assert array.status_code == 400
    assert sim.chats() == []


# -- get ----------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [V2, EXP])
async def test_get_chat(sim: Simulator, prefix: str) -> None:
    async with Wire(sim, prefix) as wire:
        created = await wire.create("fetch me")
        await sim.wait_for_status(created["id"], "waiting")
        chat = await get_chat(wire, created["id"])
        assert chat["id"] == created["id"]
        assert chat["status"] == "waiting"
        assert chat["title"] == "fetch me"
        assert chat["created_at"] == created["created_at"]


@pytest.mark.parametrize("prefix", [V2, EXP])
async def test_get_unknown_chat_is_404(sim: Simulator, prefix: str) -> None:
    async with Wire(sim, prefix) as wire:
        for path in ("", "/messages"):
            response = await wire.http.get(f"{prefix}/{uuid.uuid4()}{path}")
            body = expect_error(response, 404, NOT_FOUND)
            assert set(body) <= {"message", "detail"}


@pytest.mark.parametrize("prefix", [V2, EXP])
async def test_malformed_chat_id_is_400(sim: Simulator, prefix: str) -> None:
    async with Wire(sim, prefix) as wire:
        for method, path in [
            ("GET", "/not-a-uuid"),
            ("PATCH", "/not-a-uuid"),
            ("GET", "/1234/messages"),
            ("POST", "/1234/interrupt"),
        ]:
            response = await wire.http.request(method, f"{prefix}{path}", json={})
            assert response.status_code == 400, (method, path, response.text)
            assert response.json()["message"]


# -- list ---------------------------------------------------------------------------------


async def test_list_is_newest_first(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        made = [(await wire.create(f"chat {i}"))["id"] for i in range(4)]
        assert await list_ids(wire) == made[::-1]


async def test_list_pagination(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        made = [(await wire.create(f"chat {i}"))["id"] for i in range(5)]
        newest_first = made[::-1]
        assert await list_ids(wire, limit=2) == newest_first[:2]
        assert await list_ids(wire, limit=2, offset=2) == newest_first[2:4]
        assert await list_ids(wire, offset=4) == newest_first[4:]
        assert await list_ids(wire, limit=0) == newest_first
        assert await list_ids(wire, after_id=newest_first[1]) == newest_first[2:]
        assert await list_ids(wire, after_id=newest_first[1], limit=2) == newest_first[2:4]
        assert await list_ids(wire, after_id=newest_first[-1]) == []
        for bad in ({"limit": "many"}, {"offset": "-1"}, {"after_id": "not-a-uuid"}):
            response = await wire.http.get(V2, params=bad)
            assert response.status_code == 400, (bad, response.text)


async def test_list_label_filters_are_anded(sim: Simulator) -> None:
    nightly_42 = sim.seed(1, labels={"workflow": "nightly", "run": "42"})
    nightly_43 = sim.seed(1, labels={"workflow": "nightly", "run": "43"})
    weekly_42 = sim.seed(1, labels={"workflow": "weekly", "run": "42"})
    sim.seed(1)
    async with Wire(sim) as wire:
        assert set(await list_ids(wire, label="workflow:nightly")) == {
            str(i) for i in nightly_42 + nightly_43
        }
        both = await list_ids(wire, label=["workflow:nightly", "run:42"])
        assert both == [str(nightly_42[0])]
        assert await list_ids(wire, label=["workflow:weekly", "run:42"]) == [str(weekly_42[0])]
        assert await list_ids(wire, label=["workflow:weekly", "run:43"]) == []
        assert await list_ids(wire, label="workflow:monthly") == []
        assert len(await list_ids(wire)) == 4


async def test_list_label_value_may_contain_colons(sim: Simulator) -> None:
    [chat] = sim.seed(1, labels={"url": "https://example.com"})
    sim.seed(1, labels={"url": "https"})
    async with Wire(sim) as wire:
        assert await list_ids(wire, label="url:https://example.com") == [str(chat)]


@pytest.mark.parametrize("bad", ["nocolon", ":value", "key:", ":"])
async def test_list_rejects_malformed_label_filters(sim: Simulator, bad: str) -> None:
    async with Wire(sim) as wire:
        response = await wire.http.get(V2, params={"label": ["ok:1", bad]})
        expect_error(
            response,
            400,
            f'Invalid label filter: "{bad}" (expected format key:value, both must be non-empty)',
        )


async def test_list_hides_archived_chats_unless_asked(sim: Simulator) -> None:
    [archived] = sim.seed(1, archived=True, labels={"w": "x"})
    [live] = sim.seed(1, labels={"w": "x"})
    async with Wire(sim) as wire:
        assert await list_ids(wire) == [str(live)]
        assert await list_ids(wire, q="archived:false") == [str(live)]
        assert await list_ids(wire, q="archived:true") == [str(archived)]
        assert await list_ids(wire, q="archived:true", label="w:x") == [str(archived)]


@pytest.mark.parametrize("q", ["nightly", "archived:true stray", "archived:maybe"])
async def test_list_rejects_invalid_search_queries(sim: Simulator, q: str) -> None:
    async with Wire(sim) as wire:
        expect_error(await wire.http.get(V2, params={"q": q}), 400, "Invalid chat search query.")


async def test_list_title_search(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        alpha = await wire.create("alpha release notes")
        await wire.create("beta plan")
        assert await list_ids(wire, q="title:alpha") == [alpha["id"]]
        assert await list_ids(wire, q='title:"release notes"') == [alpha["id"]]


# -- update -------------------------------------------------------------------------------


async def test_archive_and_unarchive(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat = await wire.create("to be archived")
        chat_id = chat["id"]
        await sim.wait_for_status(chat_id, "waiting")

        response = await patch(wire, chat_id, {"archived": True})
        assert response.status_code == 204
        assert response.content == b""
        assert (await get_chat(wire, chat_id))["archived"] is True
        assert await list_ids(wire) == []
        assert await list_ids(wire, q="archived:true") == [chat_id]
        expect_error(
            await patch(wire, chat_id, {"archived": True}), 400, "Chat is already archived."
        )

        response = await patch(wire, chat_id, {"archived": False})
        assert response.status_code == 204
        assert (await get_chat(wire, chat_id))["archived"] is False
        assert await list_ids(wire) == [chat_id]
        expect_error(
            await patch(wire, chat_id, {"archived": False}), 400, "Chat is already not archived."
        )

    archives = [(r.chat_id, r.archived) for r in sim.records.archives]
    assert archives == [(uuid.UUID(chat_id), True), (uuid.UUID(chat_id), False)]


async def test_archiving_a_running_chat_is_409(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat = await wire.create("keep busy /sleep 2")
        chat_id = chat["id"]
        expect_error(await patch(wire, chat_id, {"archived": True}), 409, ARCHIVE_ACTIVE)
        assert (await get_chat(wire, chat_id))["archived"] is False
        assert sim.records.archives == []

        # The sweep recipe: interrupt, wait for the run to settle, then archive.
        interrupted = await wire.http.post(f"{V2}/{chat_id}/interrupt")
        assert interrupted.status_code == 200
        await sim.wait_for_status(chat_id, "waiting")
        assert (await patch(wire, chat_id, {"archived": True})).status_code == 204
        assert sim.chat(chat_id).archived is True


async def test_archiving_a_chat_waiting_on_tools_is_409(sim: Simulator) -> None:
    [paused] = sim.seed(1, status="requires_action")
    async with Wire(sim) as wire:
        expect_error(await patch(wire, str(paused), {"archived": True}), 409, ARCHIVE_ACTIVE)
    assert sim.chat(paused).archived is False


async def test_an_errored_chat_can_be_archived(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat = await wire.create("break /fail fatal")
        await sim.wait_for_status(chat["id"], "error")
        assert (await patch(wire, chat["id"], {"archived": True})).status_code == 204
        archived = await get_chat(wire, chat["id"])
        assert archived["archived"] is True
        assert archived["status"] == "error"


async def test_patch_labels_replace_the_whole_map(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat = await wire.create("labelled", labels={"a": "1", "b": "2"})
        chat_id = chat["id"]
        assert (await patch(wire, chat_id, {"labels": {"c": "3"}})).status_code == 204
        assert (await get_chat(wire, chat_id))["labels"] == {"c": "3"}

        body = expect_error(
            await patch(wire, chat_id, {"labels": {"bad key": "v"}}), 400, "Invalid labels."
        )
        assert [v["field"] for v in body["validations"]] == ["labels.bad key"]
        assert (await get_chat(wire, chat_id))["labels"] == {"c": "3"}

        # A PATCH without labels leaves them alone; an empty map clears them.
        assert (await patch(wire, chat_id, {"title": "renamed"})).status_code == 204
        assert (await get_chat(wire, chat_id))["labels"] == {"c": "3"}
        assert (await patch(wire, chat_id, {"labels": {}})).status_code == 204
        assert (await get_chat(wire, chat_id))["labels"] == {}
        assert await list_ids(wire, label="c:3") == []


async def test_patch_title_rules(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("original title"))["id"]
        assert (await patch(wire, chat_id, {"title": "  Renamed chat  "})).status_code == 204
        assert (await get_chat(wire, chat_id))["title"] == "Renamed chat"
        for bad in ("", "   ", "t" * 201):
            response = await patch(wire, chat_id, {"title": bad})
            assert response.status_code == 400, bad
            assert response.json()["message"]
        assert (await get_chat(wire, chat_id))["title"] == "Renamed chat"
        # The cap is in runes, not bytes.
        runes = "é" * 200
        assert (await patch(wire, chat_id, {"title": runes})).status_code == 204
        assert (await get_chat(wire, chat_id))["title"] == runes


async def test_patch_plan_mode(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("plan it"))["id"]
        assert (await patch(wire, chat_id, {"plan_mode": "plan"})).status_code == 204
        assert (await get_chat(wire, chat_id))["plan_mode"] == "plan"
        expect_error(
            await patch(wire, chat_id, {"plan_mode": "build"}), 400, "Invalid plan_mode value."
        )
        assert (await get_chat(wire, chat_id))["plan_mode"] == "plan"


async def test_patch_unknown_chat_is_404(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        expect_error(await patch(wire, str(uuid.uuid4()), {"archived": True}), 404, NOT_FOUND)
    assert sim.records.archives == []
