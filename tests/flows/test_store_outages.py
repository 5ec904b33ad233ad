"""The store goes away in the middle of a workflow: every task rides it out.

A private PostgreSQL server (:mod:`tests.pgcluster`) holds the workflow's store; it
is stopped at a chosen moment, inside a chosen task, and started again a little
later. The workflow still completes, each step's prompt reaches the chat once, and
the store says FINISHED.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from uuid import uuid4

import pytest

from coder_chat.durable.postgres import PostgresStore
from coder_chat.durable.records import WorkflowState
from coder_chat.simulator import Simulator
from prefect_coder.blocks import PostgresLedger
from prefect_coder.flows.durable_chat import durable_chat
from prefect_coder.tasks.settings import WorkflowSettings
from tests.pgcluster import PgCluster

from .example_tools import CHARGES

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.timeout(180)]

PROMPTS = ["plan the refund", 'charge it /tool charge_card {"amount_cents": 250}', "confirm"]
TOOLS = ["tests.flows.example_tools:charge_card"]
#: How long the store stays away: longer than the first retry's delay.
OUTAGE = 2.0


@pytest.fixture(scope="module")
def pg() -> Iterator[PgCluster]:
    with PgCluster() as cluster:
        yield cluster


@pytest.fixture
async def ledger(pg: PgCluster) -> AsyncIterator[str]:
    """A saved PostgresLedger block on the private server, in its own schema."""
    name = f"outage-{uuid4().hex[:8]}"
    await PostgresLedger(dsn=pg.dsn, db_schema=name.replace("-", "_")).save(name)
    yield f"prefect-coder-postgres-ledger/{name}"


@pytest.fixture
def coder_env(sim: Simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in sim.env().items():
        monkeypatch.setenv(name, value)
    CHARGES.clear()


@pytest.mark.usefixtures("coder_env")
@pytest.mark.parametrize(
    ("route", "task"),
    [
        (None, "begin-workflow"),
        ("create_chat", "run-turn of step 1"),
        ("send_message", "run-turn of step 2"),
        ("tool_results", "run-turn of step 2, between its tool and Coder"),
        ("update_chat", "archive-chat, then finish-workflow"),
    ],
)
async def test_a_store_outage_inside_a_task_does_not_fail_the_workflow(
    sim: Simulator, pg: PgCluster, ledger: str, route: str | None, task: str
) -> None:
    wf = f"wf-outage-{route or 'begin'}"
    if route is None:
        await asyncio.to_thread(pg.stop)  # down before the flow's first task
    else:
        sim.faults.hold(route, "before")
    run = asyncio.create_task(
        durable_chat(
            workflow_id=wf,
            prompts=PROMPTS,
            tools=TOOLS,
            ledger=await PostgresLedger.aload(ledger.split("/", 1)[1]),
            settings=WorkflowSettings(
                heartbeat_seconds=0.2, request_timeout_seconds=10, step_deadline_seconds=60
            ),
        )
    )
    if route is None:
        await asyncio.sleep(0.5)
        await asyncio.to_thread(pg.start)
    else:
        held = await sim.faults.wait_held(route, timeout=60)
        await asyncio.to_thread(pg.stop)
        sim.faults.decide(held.id, "release")
        await asyncio.sleep(OUTAGE)
        await asyncio.to_thread(pg.start)
    results = await asyncio.wait_for(run, timeout=120)

    assert [r.step for r in results] == [1, 2, 3]
    chat_id = results[0].chat_id
    assert sim.chat(chat_id).archived
    for step in (1, 2, 3):
        marker = f"[{wf}/step-{step}]"
        sent = [m for m in sim.messages(chat_id) if m.role == "user" and marker in m.text()]
        assert len(sent) == 1, (task, step, [m.text() for m in sent])
    assert list(CHARGES.values()) == [1]
    block: PostgresLedger = await PostgresLedger.aload(ledger.split("/", 1)[1])
    store = block.get_store()
    assert isinstance(store, PostgresStore)
    try:
        workflow = await store.get_workflow(str(sim.organization_id), wf)
    finally:
        await store.close()
    assert workflow is not None and workflow.state == WorkflowState.FINISHED, (task, workflow)
