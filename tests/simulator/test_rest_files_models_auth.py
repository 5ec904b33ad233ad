"""Authentication, file attachments and model listings over plain HTTP (wire reference 1.2, 3.11, 3.12)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from coder_chat.simulator import Simulator

from .wire import EXP, NOT_FOUND, V2, Wire, expect_error

UNSUPPORTED = "Unsupported file type."
MISMATCH = "File content type does not match Content-Type header."
MAX_FILE = 10 * 1024 * 1024

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(64))
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(64))
GIF = b"GIF89a\x01\x00\x01\x00\x80\x00\x00" + bytes(range(32))
PDF = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n"
WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 \x18\x00\x00\x00" + bytes(range(32))


async def upload(
    wire: Wire,
    data: bytes,
    content_type: str | None,
    *,
    organization: str | None = "",
    filename: str | None = None,
) -> httpx.Response:
    params = {}
    if organization is not None:
        params["organization"] = organization or str(wire.sim.organization_id)
    headers = {}
    if content_type is not None:
        headers["Content-Type"] = content_type
    if filename is not None:
        headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    return await wire.http.post(
        f"{wire.prefix}/files", params=params, content=data, headers=headers
    )


async def uploaded(wire: Wire, data: bytes, content_type: str, **kw: Any) -> str:
    response = await upload(wire, data, content_type, **kw)
    assert response.status_code == 201, response.text
    file_id: str = response.json()["id"]
    return file_id


# -- authentication -----------------------------------------------------------------------

CHAT = "00000000-0000-0000-0000-0000000000c1"
ROUTES = [
    ("GET", ""),
    ("POST", ""),
    ("GET", f"/{CHAT}"),
    ("PATCH", f"/{CHAT}"),
    ("GET", f"/{CHAT}/messages"),
    ("POST", f"/{CHAT}/messages"),
    ("POST", f"/{CHAT}/interrupt"),
    ("POST", f"/{CHAT}/tool-results"),
    ("DELETE", f"/{CHAT}/queue/1"),
    ("POST", f"/{CHAT}/queue/1/promote"),
    ("POST", "/files"),
    ("GET", f"/files/{CHAT}"),
]


@pytest.mark.parametrize("prefix", [V2, EXP])
@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_rest_routes_require_a_session_token(
    sim: Simulator, prefix: str, method: str, path: str
) -> None:
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        for headers in (
            {},
            {"Coder-Session-Token": "wrong-" + sim.token},
            {"Coder-Session-Token": ""},
        ):
            response = await http.request(method, prefix + path, headers=headers, json={})
            assert response.status_code == 401, (headers, response.text)
            assert response.json()["message"]
            assert sim.token not in response.text
    assert sim.chats() == []
    assert sim.records.interrupts == []


@pytest.mark.parametrize(
    "path",
    [
        "/api/experimental/chats/model-configs",
        "/api/v2/organizations/{org}/chats/models",
        "/api/v2/chats/model-configs",
    ],
)
async def test_model_routes_require_a_session_token(sim: Simulator, path: str) -> None:
    url = path.format(org=sim.organization_id)
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        assert (await http.get(url)).status_code == 401
        assert (await http.get(url, headers={"Coder-Session-Token": "nope"})).status_code == 401


async def test_unauthenticated_requests_have_no_effect(sim: Simulator) -> None:
    [chat] = sim.seed(1)
    async with httpx.AsyncClient(base_url=sim.base_url) as http, Wire(sim) as wire:
        body = wire.create_body("should not exist")
        assert (await http.post(V2, json=body)).status_code == 401
        patch = await http.patch(f"{V2}/{chat}", json={"archived": True, "labels": {"a": "b"}})
        assert patch.status_code == 401
        send = await http.post(
            f"{V2}/{chat}/messages", json={"content": [{"type": "text", "text": "x"}]}
        )
        assert send.status_code == 401
    assert [c.id for c in sim.chats()] == [chat]
    assert sim.chat(chat).archived is False
    assert sim.chat(chat).labels == {}
    assert len(sim.messages(chat)) == 2
    assert sim.records.archives == []


async def test_cookie_and_query_parameter_tokens_are_accepted(sim: Simulator) -> None:
    async with httpx.AsyncClient(base_url=sim.base_url) as http:
        by_query = await http.get(V2, params={"coder_session_token": sim.token})
        assert by_query.status_code == 200
        assert by_query.json() == []
        http.cookies.set("coder_session_token", sim.token)
        assert (await http.get(V2)).status_code == 200
        http.cookies.set("coder_session_token", "wrong")
        assert (await http.get(V2)).status_code == 401


def ws_url(sim: Simulator, path: str) -> str:
    return sim.base_url.replace("http://", "ws://", 1) + path


async def expect_ws_rejected(url: str, headers: dict[str, str], status: int, token: str) -> None:
    with pytest.raises(InvalidStatus) as caught:
        async with websockets.connect(url, additional_headers=headers):
            pass
    response = caught.value.response
    assert response.status_code == status
    assert token not in bytes(response.body or b"").decode()


@pytest.mark.parametrize("prefix", [V2, EXP])
async def test_websocket_upgrades_require_a_session_token(sim: Simulator, prefix: str) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("hello"))["id"]
    for path in (f"{prefix}/{chat_id}/stream", f"{prefix}/watch"):
        url = ws_url(sim, path)
        await expect_ws_rejected(url, {}, 401, sim.token)
        await expect_ws_rejected(url, {"Coder-Session-Token": "wrong"}, 401, sim.token)
        await expect_ws_rejected(url + "?coder_session_token=wrong", {}, 401, sim.token)
    rejected = [r for r in sim.records.requests if r.route in ("stream", "watch")]
    assert [r.status for r in rejected] == [401] * 6


async def test_websocket_upgrades_with_a_token(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat_id = (await wire.create("hello"))["id"]
        await sim.wait_for_status(chat_id, "waiting")
        async with wire.stream(chat_id) as reader:
            status = await reader.until_status("waiting")
            assert status["chat_id"] == chat_id
    # Browsers cannot set headers on a WebSocket: the query parameter works too.
    url = ws_url(sim, f"{V2}/watch?coder_session_token={sim.token}")
    async with websockets.connect(url) as ws:
        assert ws.response is not None
        assert ws.response.status_code == 101


async def test_websocket_upgrade_errors_are_plain_http(sim: Simulator) -> None:
    headers = {"Coder-Session-Token": sim.token}
    await expect_ws_rejected(ws_url(sim, f"{V2}/{uuid.uuid4()}/stream"), headers, 404, sim.token)
    await expect_ws_rejected(ws_url(sim, f"{V2}/not-a-uuid/stream"), headers, 400, sim.token)
    [chat] = sim.seed(1)
    await expect_ws_rejected(
        ws_url(sim, f"{V2}/{chat}/stream?after_id=abc"), headers, 400, sim.token
    )


async def test_the_token_never_appears_in_responses(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        file_id = await uploaded(wire, b"notes", "text/plain")
        chat = await wire.create(
            "hello", labels={"k": "v"}, unsafe_dynamic_tools=[{"name": "t", "input_schema": {}}]
        )
        chat_id = chat["id"]
        await sim.wait_for_status(chat_id, "waiting")
        responses = [
            await wire.http.get(V2),
            await wire.http.get(f"{V2}/{chat_id}"),
            await wire.http.get(f"{V2}/{chat_id}/messages"),
            await wire.send(chat_id, "again"),
            await wire.http.post(f"{V2}/{chat_id}/interrupt"),
            await wire.http.get(f"{EXP}/model-configs"),
            await wire.http.get(f"/api/v2/organizations/{sim.organization_id}/chats/models"),
            await wire.http.get(f"{V2}/files/{file_id}"),
            await wire.http.get(f"{V2}/{uuid.uuid4()}"),
            await wire.http.post(V2, json={}),
        ]
        assert [r.status_code for r in responses][:3] == [200, 200, 200]
        for response in responses:
            assert sim.token not in response.text
            assert all(sim.token not in value for value in response.headers.values())


# -- files --------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [V2, EXP])
async def test_upload_and_download_a_file(sim: Simulator, prefix: str) -> None:
    async with Wire(sim, prefix) as wire:
        response = await upload(wire, PNG, "image/png", filename="diagram.png")
        assert response.status_code == 201, response.text
        body = response.json()
        assert set(body) == {"id"}
        file_id = body["id"]
        uuid.UUID(file_id)

        download = await wire.http.get(f"{prefix}/files/{file_id}")
        assert download.status_code == 200
        assert download.content == PNG
        assert download.headers["content-type"] == "image/png"
        disposition = download.headers["content-disposition"]
        assert disposition.startswith("inline")
        assert 'filename="diagram.png"' in disposition
        assert "private" in download.headers["cache-control"]


@pytest.mark.parametrize(
    ("content_type", "data"),
    [
        ("application/json", b'{"a": [1, 2, 3]}'),
        ("application/pdf", PDF),
        ("image/gif", GIF),
        ("image/jpeg", JPEG),
        ("image/png", PNG),
        ("image/webp", WEBP),
        ("text/csv", b"a,b\n1,2\n"),
        ("text/markdown", b"# Title\n\n* item\n"),
        ("text/plain", b"plain words\n"),
        ("text/plain; charset=utf-8", "caf\u00e9\n".encode()),
        ("IMAGE/PNG", PNG),
    ],
)
async def test_every_allowed_type_uploads(sim: Simulator, content_type: str, data: bytes) -> None:
    async with Wire(sim) as wire:
        file_id = await uploaded(wire, data, content_type)
        download = await wire.http.get(f"{V2}/files/{file_id}")
        assert download.content == data
        stored_type = content_type.split(";")[0].strip().lower()
        assert download.headers["content-type"].split(";")[0] == stored_type


@pytest.mark.parametrize(
    "content_type",
    ["application/zip", "application/octet-stream", "image/svg+xml", "text/html", None],
)
async def test_unsupported_types_are_400(sim: Simulator, content_type: str | None) -> None:
    async with Wire(sim) as wire:
        body = expect_error(await upload(wire, b"some bytes", content_type), 400, UNSUPPORTED)
        for allowed in ("application/json", "image/png", "text/plain", "text/markdown"):
            assert allowed in body["detail"]
    assert sim.engine.files == {}


@pytest.mark.parametrize(
    ("content_type", "data"),
    [
        ("image/png", b"this is just text"),
        ("image/png", JPEG),
        ("text/plain", PNG),
        ("application/pdf", GIF),
        ("application/json", PDF),
        ("image/webp", b"RIFF\x00\x00\x00\x00WAVEfmt "),
    ],
)
async def test_sniffed_type_must_match(sim: Simulator, content_type: str, data: bytes) -> None:
    async with Wire(sim) as wire:
        expect_error(await upload(wire, data, content_type), 400, MISMATCH)
    assert sim.engine.files == {}


async def test_files_are_capped_at_10_mib(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        expect_error(
            await upload(wire, b"a" * (MAX_FILE + 1), "text/plain"),
            413,
            "File too large.",
            "Maximum file size is 10485760 bytes.",
        )
        assert sim.engine.files == {}
        file_id = await uploaded(wire, b"b" * MAX_FILE, "text/plain")
        download = await wire.http.get(f"{V2}/files/{file_id}")
        assert len(download.content) == MAX_FILE


async def test_upload_organization_parameter(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        expect_error(
            await upload(wire, b"x", "text/plain", organization=None),
            400,
            "Missing organization query parameter.",
        )
        expect_error(
            await upload(wire, b"x", "text/plain", organization="not-a-uuid"),
            400,
            "Invalid organization ID.",
        )
        other = await upload(wire, b"x", "text/plain", organization=str(uuid.uuid4()))
        assert other.status_code == 403
    assert sim.engine.files == {}


async def test_unknown_file_is_404(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        expect_error(await wire.http.get(f"{V2}/files/{uuid.uuid4()}"), 404, NOT_FOUND)


async def test_files_referenced_from_content(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        image = await uploaded(wire, PNG, "image/png", filename="shot.png")
        notes = await uploaded(wire, b"todo: ship", "text/plain", filename="notes.txt")
        body = wire.create_body("look at this")
        body["content"].append({"type": "file", "file_id": image})
        response = await wire.http.post(V2, json=body)
        assert response.status_code == 201, response.text
        created = response.json()
        [meta] = created["files"]
        assert meta["id"] == image
        assert meta["name"] == "shot.png"
        assert meta["mime_type"] == "image/png"
        assert meta["size_bytes"] == len(PNG)
        assert meta["organization_id"] == str(sim.organization_id)
        assert meta["owner_id"] == str(sim.config.owner_id)
        assert "created_at" in meta
        assert created["title"] == "look at this"

        chat_id = created["id"]
        user = (await wire.messages(chat_id))["messages"][-1]
        assert user["content"] == [
            {"type": "text", "text": "look at this"},
            {"type": "file", "file_id": image, "media_type": "image/png"},
        ]

        await sim.wait_for_status(chat_id, "waiting")
        sent = await wire.http.post(
            f"{V2}/{chat_id}/messages",
            json={"content": [{"type": "file", "file_id": notes}]},
        )
        assert sent.status_code == 200, sent.text
        assert sent.json()["message"]["content"] == [
            {"type": "file", "file_id": notes, "media_type": "text/plain"}
        ]
        linked = (await wire.http.get(f"{V2}/{chat_id}")).json()["files"]
        assert [f["id"] for f in linked] == [image, notes]


async def test_a_file_only_prompt_is_titled_new_chat(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        image = await uploaded(wire, PNG, "image/png")
        body = {
            "organization_id": str(sim.organization_id),
            "content": [{"type": "file", "file_id": image}],
        }
        response = await wire.http.post(V2, json=body)
        assert response.status_code == 201, response.text
        assert response.json()["title"] == "New Chat"


@pytest.mark.parametrize("file_id", ["6f1c2d4e-8a9b-4c3d-9e0f-1a2b3c4d5e6f", "not-a-uuid", None])
async def test_unknown_file_in_content_is_400(sim: Simulator, file_id: str | None) -> None:
    async with Wire(sim) as wire:
        content = [{"type": "text", "text": "see"}, {"type": "file", "file_id": file_id}]
        body = {"organization_id": str(sim.organization_id), "content": content}
        expect_error(
            await wire.http.post(V2, json=body),
            400,
            "Invalid input part.",
            "content[1].file_id references a file that does not exist.",
        )
        assert sim.chats() == []
        [chat] = sim.seed(1)
        expect_error(
            await wire.http.post(f"{V2}/{chat}/messages", json={"content": content}),
            400,
            "Invalid input part.",
            "content[1].file_id references a file that does not exist.",
        )
        assert len(sim.messages(chat)) == 2


# -- model configs ------------------------------------------------------------------------


async def test_legacy_model_configs(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        response = await wire.http.get(f"{EXP}/model-configs")
        assert response.status_code == 200
        configs = response.json()
        assert isinstance(configs, list)
        assert configs
        for config in configs:
            assert {
                "id",
                "provider",
                "model",
                "display_name",
                "enabled",
                "is_default",
                "context_limit",
                "compression_threshold",
                "created_at",
                "updated_at",
            } <= set(config)
            uuid.UUID(config["id"])
        assert sum(c["is_default"] for c in configs) == 1


async def test_org_models(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        response = await wire.http.get(f"/api/v2/organizations/{sim.organization_id}/chats/models")
        assert response.status_code == 200
        body = response.json()
        assert set(body) == {"models", "providers", "unsupported_providers"}
        providers = {p["id"]: p for p in body["providers"]}
        assert all(isinstance(p["type"], str) and p["type"] for p in providers.values())
        for model in body["models"]:
            assert "provider" not in model
            assert model["ai_provider_id"] in providers
        legacy = (await wire.http.get(f"{EXP}/model-configs")).json()
        assert [m["id"] for m in body["models"]] == [c["id"] for c in legacy]
        assert [m["model"] for m in body["models"]] == [c["model"] for c in legacy]

        other = await wire.http.get(f"/api/v2/organizations/{uuid.uuid4()}/chats/models")
        assert other.status_code == 404


@pytest.mark.parametrize("segment", ["model-configs", "models"])
async def test_reserved_segments_under_v2_are_404(sim: Simulator, segment: str) -> None:
    async with Wire(sim) as wire:
        response = await wire.http.get(f"{V2}/{segment}")
        # Reserved: not a malformed chat id (400), not a server error.
        assert response.status_code == 404, response.text
        assert response.json()["message"]
