"""Blocks saved and loaded through a real Prefect API, and Prefect's block standards."""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import os
import sys
import uuid
import weakref
from importlib.metadata import entry_points
from pathlib import Path
from subprocess import PIPE, STDOUT
from typing import Any, TypeVar

import pytest
from PIL import Image
from prefect import flow
from prefect.blocks.core import Block
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL
from prefect.testing.standard_test_suites.blocks import BlockStandardTestSuite
from pydantic import SecretStr

from coder_chat import ChatClient, CoderConfigError
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator import Simulator
from prefect_coder import DurableChat
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger

ALL_BLOCKS: list[type[Block]] = [CoderCredentials, SqliteLedger, PostgresLedger]
ROOT = Path(__file__).resolve().parents[2]
LOGO = ROOT / "prefect_coder" / "blocks" / "logo.png"
B = TypeVar("B", bound=Block)


async def load(cls: type[B], name: str) -> B:
    """``aload`` with its type kept (Prefect's decorator erases it)."""
    block = await cls.aload(name)
    assert isinstance(block, cls)
    return block


@pytest.mark.parametrize("block", ALL_BLOCKS)
class TestBlockStandards(BlockStandardTestSuite):
    @pytest.fixture
    def block(self, block: type[Block]) -> type[Block]:
        return block

    def test_has_a_valid_image(self, block: type[Block]) -> None:
        """Prefect's check, on the committed file the logo's address serves (this machine
        reaches no such address): a square PNG of 46 to 999 pixels."""
        logo_url = str(block._logo_url)
        assert logo_url.endswith(f"/raw/main/{LOGO.relative_to(ROOT)}"), logo_url
        with Image.open(LOGO) as image:
            assert image.format == "PNG"
            assert image.width == image.height, image.size
            assert 1000 > image.width > 45, image.size


def test_a_team_offline_registers_the_logo_it_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read when each block type is registered, not at import: every save registers again."""
    served = "http://assets.example.internal/prefect-coder/logo.png"
    monkeypatch.setenv("PREFECT_CODER_LOGO_URL", served)
    assert {str(b._to_block_type().logo_url) for b in ALL_BLOCKS} == {served}
    monkeypatch.delenv("PREFECT_CODER_LOGO_URL")
    hosted = {str(b._to_block_type().logo_url) for b in ALL_BLOCKS}
    assert hosted == {
        f"https://github.com/prefect-coder/prefect-coder/raw/main/{LOGO.relative_to(ROOT)}"
    }


def test_a_logo_address_prefect_would_refuse_keeps_the_hosted_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Prefect takes only an http(s) address: a path would make every save of a block fail."""
    monkeypatch.setenv("PREFECT_CODER_LOGO_URL", "/static/logo-refused.png")
    with caplog.at_level(logging.WARNING, logger="prefect_coder.blocks"):
        logo = str(CoderCredentials._to_block_type().logo_url)
        for block in ALL_BLOCKS:  # every save registers its type again: no warning again
            block._to_block_type()
    assert logo.endswith(f"/raw/main/{LOGO.relative_to(ROOT)}"), logo
    warned = [r for r in caplog.records if "is not an http(s) address" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    assert "'/static/logo-refused.png' is not an http(s) address" in caplog.text


def test_slugs_are_prefixed_and_stable() -> None:
    assert [b.get_block_type_slug() for b in ALL_BLOCKS] == [
        "prefect-coder-credentials",
        "prefect-coder-sqlite-ledger",
        "prefect-coder-postgres-ledger",
    ]


@pytest.mark.usefixtures("prefect_api")
async def test_credentials_round_trip_keeps_the_token_secret(sim: Simulator) -> None:
    name = f"creds-{uuid.uuid4().hex[:8]}"
    block = CoderCredentials(
        base_url=sim.base_url, token=SecretStr(sim.token), organization_id=str(sim.organization_id)
    )
    await block.asave(name)
    loaded = await load(CoderCredentials, name)
    assert loaded.resolved() == (sim.base_url, sim.token, str(sim.organization_id))
    assert sim.token not in repr(loaded)
    async with get_client() as client:
        document = await client.read_block_document_by_name(
            name, "prefect-coder-credentials", include_secrets=False
        )
    assert sim.token not in str(document.data)  # the API hands out the obfuscated form
    session = loaded.session(labels={"suite": "blocks"}, request_timeout=10)
    result = await session.generate("hello from a block")
    await session.aclose()
    assert result.text == 'You said: "hello from a block"'
    assert sim.chat(result.chat_id).labels == {"suite": "blocks"}


@pytest.mark.usefixtures("prefect_api")
async def test_ledger_blocks_round_trip(tmp_path: Path) -> None:
    sqlite_name, pg_name = f"sqlite-{uuid.uuid4().hex[:8]}", f"pg-{uuid.uuid4().hex[:8]}"
    await SqliteLedger(path=str(tmp_path / "ledger.db")).asave(sqlite_name)
    await PostgresLedger(dsn=SecretStr("postgresql://u:pw-secret@127.0.0.1/db")).asave(pg_name)
    sqlite = await load(SqliteLedger, sqlite_name)
    postgres = await load(PostgresLedger, pg_name)
    assert sqlite.resolved_path() == tmp_path / "ledger.db"
    assert postgres.dsn.get_secret_value() == "postgresql://u:pw-secret@127.0.0.1/db"
    assert "pw-secret" not in repr(postgres)
    store = sqlite.get_store()
    assert isinstance(store, SqliteStore)
    fence = await store.begin_run("org", "wf-block")
    await store.save_checkpoint(fence, "chat-1", 7)
    record = await store.get_workflow("org", "wf-block")
    assert record is not None and record.last_seen_message_id == 7
    await store.close()


@flow(name="blocks-loaded-in-an-async-flow")
async def one_turn_with_saved_blocks(
    workflow_id: str, credentials_name: str, ledger_name: str, not_awaited: str = ""
) -> str:
    """A user's async flow that loads its blocks, awaiting all but ``not_awaited``."""
    credentials: Any = (
        CoderCredentials.load(credentials_name)
        if not_awaited == "credentials"
        else await CoderCredentials.aload(credentials_name)
    )
    ledger: Any = (
        SqliteLedger.load(ledger_name)
        if not_awaited == "ledger"
        else await SqliteLedger.aload(ledger_name)
    )
    async with DurableChat(workflow_id, credentials=credentials, ledger=ledger) as chat:
        return (await chat.turn("hello")).text


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("not_awaited", ["ledger", "credentials"])
async def test_a_block_loaded_without_await_in_an_async_flow_says_to_await_it(
    sim: Simulator, tmp_path: Path, not_awaited: str
) -> None:
    """``SqliteLedger.load(name)`` in an async flow is a coroutine (Prefect's dispatch): the
    run fails at once with a CoderConfigError that names ``aload``, not an AttributeError
    deep inside; awaited, the same blocks run the turn."""
    suffix = uuid.uuid4().hex[:8]
    credentials_name, ledger_name = f"creds-{suffix}", f"sqlite-{suffix}"
    await CoderCredentials(
        base_url=sim.base_url, token=SecretStr(sim.token), organization_id=str(sim.organization_id)
    ).asave(credentials_name)
    await SqliteLedger(path=str(tmp_path / "ledger.db")).asave(ledger_name)
    cls = "SqliteLedger" if not_awaited == "ledger" else "CoderCredentials"
    with pytest.raises(CoderConfigError) as raised:
        await one_turn_with_saved_blocks(
            f"wf-unawaited-{suffix}", credentials_name, ledger_name, not_awaited
        )
    message = str(raised.value)
    assert message.startswith(f"{not_awaited} is a coroutine, not a "), message
    assert f"await {cls}.aload(" in message, message
    assert not sim.chats()  # nothing was sent

    text = await one_turn_with_saved_blocks(f"wf-awaited-{suffix}", credentials_name, ledger_name)
    assert text == f'You said: "[wf-awaited-{suffix}/step-1] hello"'
    store = SqliteStore(tmp_path / "ledger.db")
    record = await store.get_workflow(str(sim.organization_id), f"wf-awaited-{suffix}")
    await store.close()
    assert record is not None and record.state == "finished"


async def test_a_coroutine_or_a_wrong_value_for_a_block_is_refused_clearly() -> None:
    """The coroutine is closed (no "never awaited" warning); a name is not a block."""

    async def aload() -> SqliteLedger:
        return SqliteLedger(path="x")

    pending = aload()
    with pytest.raises(CoderConfigError, match=r"ledger is a coroutine.*await PostgresLedger"):
        DurableChat("wf", ledger=pending)  # type: ignore[arg-type]
    assert inspect.getcoroutinestate(pending) == inspect.CORO_CLOSED
    with pytest.raises(CoderConfigError, match=r"ledger is a str \('prod'\), not a SqliteLedger"):
        DurableChat("wf", ledger="prod")  # type: ignore[arg-type]
    with pytest.raises(CoderConfigError, match=r"credentials is a dict .* CoderCredentials block"):
        DurableChat("wf", credentials={"base_url": "http://x"})  # type: ignore[arg-type]
    DurableChat("wf", ledger=SqliteLedger(path="x"))  # a loaded block is taken as it is


def test_credentials_fall_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODER_URL", "http://coder.example")
    monkeypatch.setenv("CODER_SESSION_TOKEN", "env-token")
    monkeypatch.setenv("CODER_ORG_ID", "org-from-env")
    assert CoderCredentials.from_environment().resolved() == (
        "http://coder.example",
        "env-token",
        "org-from-env",
    )
    assert CoderCredentials(base_url="", organization_id="explicit").resolved()[2] == "explicit"


def test_incomplete_credentials_say_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CODER_URL", "CODER_SESSION_TOKEN", "CODER_ORG_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(CoderConfigError, match="token / CODER_SESSION_TOKEN"):
        CoderCredentials(base_url="http://x", organization_id="o").resolved()


def test_sqlite_path_falls_back_to_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PREFECT_CODER_SQLITE_PATH", str(tmp_path / "env.db"))
    assert SqliteLedger.default().resolved_path() == tmp_path / "env.db"


@pytest.mark.usefixtures("prefect_api")
async def test_prefect_block_register_finds_every_block() -> None:
    api_url = PREFECT_API_URL.value()
    assert api_url
    exe = Path(sys.executable).parent / "prefect"
    env = {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    done = await asyncio.create_subprocess_exec(
        str(exe),
        "block",
        "register",
        "-m",
        "prefect_coder.blocks",
        env=env,
        stdout=PIPE,
        stderr=STDOUT,
    )
    output, _ = await done.communicate()
    assert done.returncode == 0, output.decode()
    async with get_client() as client:
        for block in ALL_BLOCKS:
            registered = await client.read_block_type_by_slug(block.get_block_type_slug())
            assert registered.name == block.get_block_type_name()


def test_the_collection_entry_point_names_the_blocks_module() -> None:
    found = [ep for ep in entry_points(group="prefect.collections") if ep.name == "prefect_coder"]
    assert [ep.value for ep in found] == ["prefect_coder.blocks"]


async def test_one_store_and_one_client_per_process(tmp_path: Path, sim: Simulator) -> None:
    """Blocks loaded twice (as every task loads them) share the store of their file and,
    on one event loop, the client of their deployment; a closed store is opened again."""
    first = SqliteLedger(path=str(tmp_path / "shared.db")).get_store()
    assert SqliteLedger(path=str(tmp_path / "shared.db")).get_store() is first
    assert SqliteLedger(path=str(tmp_path / "other.db")).get_store() is not first
    await first.close()
    reopened = SqliteLedger(path=str(tmp_path / "shared.db")).get_store()
    assert reopened is not first and not reopened.closed
    await reopened.close()

    def credentials() -> CoderCredentials:
        return CoderCredentials(
            base_url=sim.base_url,
            token=SecretStr(sim.token),
            organization_id=str(sim.organization_id),
        )

    client = credentials().shared_client()
    assert credentials().shared_client() is client
    assert sim.token not in repr(client)
    other_loop = await asyncio.to_thread(lambda: asyncio.run(_client_of(credentials())))
    assert other_loop is not client  # an HTTP client belongs to the loop it was made on


async def _client_of(credentials: CoderCredentials) -> object:
    return credentials.shared_client()


async def test_a_closed_loop_and_its_client_are_let_go(sim: Simulator) -> None:
    """A process that runs one event loop after another (a flow run each, say) keeps no
    client, and no loop, of those that are closed."""
    credentials = CoderCredentials(
        base_url=sim.base_url, token=SecretStr(sim.token), organization_id=str(sim.organization_id)
    )

    def one_loop() -> weakref.ref[asyncio.AbstractEventLoop]:
        loop = asyncio.new_event_loop()
        try:
            client = loop.run_until_complete(_used_client_of(credentials))
            assert isinstance(client, ChatClient)
        finally:
            loop.close()
        return weakref.ref(loop)

    gone = await asyncio.to_thread(one_loop)
    credentials.shared_client()  # the next use, on this loop, lets the closed one go
    gc.collect()
    assert gone() is None


async def _used_client_of(credentials: CoderCredentials) -> object:
    client = credentials.shared_client()
    await client.list_chats()  # a connection in its pool, as after a turn
    return client
