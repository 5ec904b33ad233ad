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
from pathlib import Path

import asyncpg
import pytest
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
from prefect.client.schemas.objects import StateType
from prefect.settings import PREFECT_API_URL, temporary_settings

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
    terminals = Terminals(procs, tmp, checkout_for(tmp), env)
    await paste(terminals, fleet_blocks()[1])
    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
        async with get_client() as client:
            await check_the_runs(client)
            await check_the_fleet(client)
    await check_the_databases(pg)


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
