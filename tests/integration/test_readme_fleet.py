"""The README's fleet, pasted in order: its ``<!-- fleet: N -->`` blocks, run as written.

The same machinery as the single-machine setup (:mod:`.test_readme_setup`: terminals
that keep their variables, background steps, pasted exports), under an empty home. The
PostgreSQL server the blocks create their databases on is one of the test's own (a
private instance, not the machine's shared server), named to the blocks by PostgreSQL's
own ``PGHOST``, ``PGPORT`` and ``PGUSER``, which the README's commands read. Both
workers run on this machine, one in terminal 1 and one in terminal 4: what makes them a
fleet is what they share, and that is what is checked: Prefect's server keeps its
state in PostgreSQL, the runs' progress is in the shared store, both workers serve the
pool, and the pool, the global limit and the sweep's parameters are what the README says.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import asyncpg
import httpx
import pytest
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
from prefect.client.schemas.objects import StateType
from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL

from prefect_coder.blocks import PostgresLedger
from tests.integration.procs import Processes, free_port, managed_processes
from tests.integration.readme_blocks import (
    FLEET_GUIDE,
    Block,
    Terminals,
    check_markup,
    checkout_for,
    fresh_machine_env,
    paste,
    setup_blocks,
    setup_section,
)
from tests.pgcluster import PgCluster
from tests.prefect_test_api import api_settings

SECTION = "## A fleet: Prefect's server on PostgreSQL, workers on several machines"
#: What step 10 runs, by deployment: the workflows and how many steps each has.
WORKFLOWS = {"durable-chat": {"fleet-hello": 2}, "durable-chats": {"fleet-a": 2, "fleet-b": 1}}

SWEEP = "prefect-coder-sweep/"

pytestmark = pytest.mark.timeout(1200)


def fleet_blocks() -> tuple[str, list[Block]]:
    section = setup_section(FLEET_GUIDE.read_text(), SECTION)
    return section, setup_blocks(section, tag="fleet")


def test_the_fleet_blocks_are_marked_numbered_and_safe_to_paste_in_order() -> None:
    section, blocks = fleet_blocks()
    check_markup(section, blocks)
    # Every machine installs as the single-machine setup's step 1 says; nothing here does.
    assert not any(b.install for b in blocks)
    assert len([b for b in blocks if "prefect worker start" in b.body]) == 2


def test_the_fleet_guide_starts_no_open_server_and_gives_no_superuser_dsn() -> None:
    """Every terminal that talks to Prefect has the auth string before it does, the server
    asks for it and listens on one address, and every DSN names a role of its own."""
    section, blocks = fleet_blocks()
    assert "0.0.0.0" not in section
    assert not re.search(r"postgres(ql)?(\+asyncpg)?://(postgres)?[@:]", section)
    terminals_with_auth: set[int] = set()
    for block in blocks:
        if "fleet-secrets/client.env" in block.body or "fleet-secrets/server.env" in block.body:
            terminals_with_auth.add(block.terminal)
        if "prefect server start" in block.body:
            assert ". ~/fleet-secrets/server.env" in block.body
            assert re.search(r"prefect server start --host \S+$", block.body, re.M)
        if re.search(r"^(prefect |python -)", block.body, re.M) and block.step > 2:
            assert block.terminal in terminals_with_auth, block
    [first] = [b for b in blocks if b.step == 1]
    assert "PREFECT_SERVER_API_AUTH_STRING=" in first.body
    assert "PREFECT_API_AUTH_STRING=" in first.body


async def test_the_readme_fleet_runs_workflows_on_a_shared_store(tmp_path: Path) -> None:
    with PgCluster() as pg:
        async with managed_processes(tmp_path) as procs:
            await scenario(procs, tmp_path, pg)


async def scenario(procs: Processes, tmp: Path, pg: PgCluster) -> None:
    port = free_port()
    env = {
        **fresh_machine_env(tmp, port),
        "PGHOST": "127.0.0.1",
        "PGPORT": str(pg.port),
        "PGUSER": "postgres",
    }
    pg.require_passwords()
    terminals = Terminals(procs, tmp, checkout_for(tmp), env)
    await paste(terminals, fleet_blocks()[1])
    api = f"http://127.0.0.1:{port}/api"
    secrets = Secrets(Path(env["HOME"]) / "fleet-secrets")
    await check_the_door_is_shut(api)
    async with api_settings({PREFECT_API_URL: api, PREFECT_API_AUTH_STRING: secrets.auth}):
        async with get_client() as client:
            await check_the_runs(client)
            await check_the_fleet(client)
        ledger: PostgresLedger = await PostgresLedger.aload("fleet")
    await check_the_databases(pg)
    await check_the_ledger_role(pg, ledger.dsn.get_secret_value())
    await check_the_prefect_role(pg, secrets.prefect_dsn)


class Secrets:
    """The files the guide's first step wrote: each readable by its owner alone, and the
    store's DSN gone once its block was saved."""

    def __init__(self, folder: Path) -> None:
        assert sorted(p.name for p in folder.iterdir()) == ["client.env", "server.env"]
        for path in folder.iterdir():
            assert path.stat().st_mode & 0o077 == 0, oct(path.stat().st_mode)
        self.server: dict[str, str] = dict(
            re.findall(r"^export (\w+)='(.*)'$", (folder / "server.env").read_text(), re.M)
        )
        self.client: dict[str, str] = dict(
            re.findall(r"^export (\w+)='(.*)'$", (folder / "client.env").read_text(), re.M)
        )

    @property
    def auth(self) -> str:
        assert (
            self.client["PREFECT_API_AUTH_STRING"] == self.server["PREFECT_SERVER_API_AUTH_STRING"]
        )
        return self.client["PREFECT_API_AUTH_STRING"]

    @property
    def prefect_dsn(self) -> str:
        url = self.server["PREFECT_API_DATABASE_CONNECTION_URL"]
        return url.replace("postgresql+asyncpg://", "postgresql://")


async def check_the_door_is_shut(api: str) -> None:
    """Without the auth string, Prefect's API reads nothing: no block, no flow run."""
    async with httpx.AsyncClient(base_url=api, timeout=30) as http:
        assert (await http.post("/block_documents/filter", json={})).status_code == 401
        assert (await http.post("/flow_runs/filter", json={})).status_code == 401
        assert (await http.get("/health")).status_code == 200  # the door, not the server


async def refused(dsn: str, *statements: str, database: str | None = None) -> list[str]:
    """Each statement that ``dsn``'s role ran without being refused (none, when all is well)."""
    ran = []
    conn = await asyncpg.connect(
        dsn if database is None else dsn.rsplit("/", 1)[0] + "/" + database
    )
    try:
        for statement in statements:
            try:
                await conn.execute(statement)
            except asyncpg.InsufficientPrivilegeError:
                continue
            ran.append(statement)
    finally:
        await conn.close()
    return ran


async def check_the_ledger_role(pg: PgCluster, dsn: str) -> None:
    """The store's role (the DSN its block holds) reads and writes its schema, and nothing
    outside it: no other schema of its database, no other database, no new database,
    schema or role. Without its password it is not let in."""
    admin_base = pg.dsn.rsplit("/", 1)[0]
    admin = await asyncpg.connect(f"{admin_base}/coder_ledger")
    try:
        await admin.execute("CREATE SCHEMA other; CREATE TABLE other.secrets (v text)")
        await admin.execute("CREATE TABLE public.shared (v text)")
    finally:
        await admin.close()
    conn = await asyncpg.connect(dsn)
    try:
        role = await conn.fetchrow(
            "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = current_user"
        )
        assert role is not None and tuple(role) == (False, False, False)
        assert await conn.fetchval("SELECT count(*) FROM prefect_coder.workflows") >= 3
    finally:
        await conn.close()
    assert (
        await refused(
            dsn,
            "SELECT * FROM other.secrets",
            "INSERT INTO other.secrets VALUES ('x')",
            "SELECT * FROM public.shared",
            "CREATE TABLE public.mine (v text)",
            "CREATE SCHEMA mine",
            "CREATE DATABASE mine",
            "CREATE ROLE mine",
        )
        == []
    )
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await asyncpg.connect(dsn.rsplit("/", 1)[0] + "/prefect")
    user, _, rest = dsn.partition("://")[2].partition(":")
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(f"postgresql://{user}:wrong@{rest.partition('@')[2]}")


async def check_the_prefect_role(pg: PgCluster, dsn: str) -> None:
    """Prefect's role owns its database, and may not reach the store's or make roles; the key
    to the blocks' secrets is not in the database."""
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM flow_run") >= 2
        # The blocks' secrets are encrypted with the server's own key, not one kept beside them.
        keys = await conn.fetchval(
            "SELECT count(*) FROM configuration WHERE key = 'ENCRYPTION_KEY'"
        )
        assert keys == 0
        assert await conn.fetchval("SELECT count(*) FROM block_document") >= 2
        assert (
            await conn.fetchval(
                "SELECT rolsuper OR rolcreatedb OR rolcreaterole FROM pg_roles WHERE rolname = current_user"
            )
            is False
        )
    finally:
        await conn.close()
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await asyncpg.connect(dsn.rsplit("/", 1)[0] + "/coder_ledger")


async def check_the_runs(client: PrefectClient) -> None:
    for deployment in WORKFLOWS:
        [run] = await client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment]))
        )
        assert run.state is not None and run.state.type == StateType.COMPLETED, run.state
        assert run.parameters["ledger"] == {
            "$ref": {"block_document_slug": "prefect-coder-postgres-ledger/fleet"}
        }
        if deployment == "durable-chat":
            assert run.name == "fleet-hello · epoch 1"
        else:
            assert run.name == "2 workflows: fleet-a, fleet-b"
            assert run.parameters["concurrency_limit"] == "coder-turns"
        assert run.work_pool_name == "coder-agents"


async def check_the_fleet(client: PrefectClient) -> None:
    pool = await client.read_work_pool("coder-agents")
    assert pool.concurrency_limit == 8
    workers = await client.read_workers_for_work_pool("coder-agents")
    assert {w.name for w in workers} == {"worker-a", "worker-b"}
    limit = await client.read_global_concurrency_limit_by_name("coder-turns")
    assert limit.limit == 16
    sweep = await client.read_deployment_by_name("orphan-sweep/orphan-sweep")
    # The sweep's blocks came from the command line, and the YAML's own parameter stayed.
    assert sweep.parameters == {
        "target_deployment": "durable-chat",
        "credentials": {"$ref": {"block_document_slug": "prefect-coder-credentials/coder"}},
        "ledger": {"$ref": {"block_document_slug": "prefect-coder-postgres-ledger/fleet"}},
    }


async def check_the_databases(pg: PgCluster) -> None:
    """Prefect's server kept its runs in ``prefect``; the store has every workflow finished,
    each step once, in ``coder_ledger``."""
    base = pg.dsn.rsplit("/", 1)[0]
    prefect_db = await asyncpg.connect(f"{base}/prefect")
    try:
        runs = await prefect_db.fetchval("SELECT count(*) FROM flow_run")
        assert runs >= 2
    finally:
        await prefect_db.close()
    store = await asyncpg.connect(f"{base}/coder_ledger")
    try:
        rows = await store.fetch("SELECT workflow_id, state FROM prefect_coder.workflows")
        steps = await store.fetch("SELECT workflow_id, step FROM prefect_coder.steps")
    finally:
        await store.close()
    expected = {wf: n for workflows in WORKFLOWS.values() for wf, n in workflows.items()}
    # (A sweep that ran meanwhile keeps its lease in the same table, under its own name.)
    states = {r["workflow_id"]: r["state"] for r in rows if not r["workflow_id"].startswith(SWEEP)}
    assert states == dict.fromkeys(expected, "finished")
    counted: dict[str, int] = {}
    for row in steps:
        counted[row["workflow_id"]] = counted.get(row["workflow_id"], 0) + 1
    assert counted == expected, json.dumps(counted)
