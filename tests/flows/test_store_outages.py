"""The store goes away in the middle of a workflow: every task rides it out.

A private PostgreSQL server (:mod:`tests.pgcluster`) holds the workflow's store; it
is stopped at a chosen moment, inside a chosen task, and started again a little
later. The workflow still completes, each step's prompt reaches the chat once, and
the store says FINISHED.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from uuid import UUID, uuid4

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName
from prefect.client.schemas.objects import State
from prefect.runtime import flow_run
from pydantic import SecretStr

from coder_chat.durable.postgres import PostgresStore
from coder_chat.durable.records import WorkflowState
from coder_chat.simulator import Simulator
from prefect_coder import DurableChat, StoreLost, Superseded
from prefect_coder.blocks import PostgresLedger
from prefect_coder.flows.durable_chat import durable_chat
from prefect_coder.flows.durable_chats import WorkflowSpec, durable_chats
from prefect_coder.settings import TaskSettings, WorkflowSettings
from tests.pgcluster import PgCluster
from tests.pgproxy import RoundTripProxy

from .example_tools import CHARGES
from .support import superseded_by_its_successor

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.timeout(180)]

PROMPTS = ["plan the refund", 'charge it /tool charge_card {"amount_cents": 250}', "confirm"]
TOOLS = ["tests.flows.example_tools:charge_card"]
#: How long the store stays away: longer than the first retry's delay.
OUTAGE = 2.0
#: Retries a store lost for good exhausts in a second or two, not the default 1 + 5 + 15 s:
#: what is tested is that it gives up, and how it ends.
QUICK_RETRIES = TaskSettings(retry_delay_seconds=[0.1, 0.3, 0.6])


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


@pytest.fixture(autouse=True)
def coder_env(sim: Simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in sim.env().items():
        monkeypatch.setenv(name, value)
    CHARGES.clear()


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


async def test_a_run_failing_while_the_store_is_away_ends_superseded_if_taken_meanwhile(
    sim: Simulator, pg: PgCluster
) -> None:
    """Run A fails for good (its own code raises) while it cannot reach the store, so it
    cannot tell whether it still holds the workflow; run B, which can, takes the workflow
    and finishes it. When the store answers A's ending, A finds B's epoch: it marks
    nothing failed and ends Cancelled/Superseded naming B, not Failed (fleet lab 14/44:
    the store out of reach through the failure's retries, a successor took over)."""
    schema = f"late_{uuid4().hex[:8]}"
    between, resume = asyncio.Event(), asyncio.Event()
    settings = WorkflowSettings(archive_at_end=False, heartbeat_seconds=0.2)

    @flow
    async def two_turns(ledger: PostgresLedger, fail: bool) -> str:
        async with DurableChat("wf-failed-late", ledger=ledger, settings=settings) as chat:
            await chat.turn("first")
            if fail:
                between.set()
                await resume.wait()
                raise RuntimeError("the user's own code failed between turns")
            return (await chat.turn("second")).text

    async with RoundTripProxy(pg.dsn) as proxy:
        through_proxy = PostgresLedger(dsn=SecretStr(proxy.dsn), db_schema=schema)
        cut_off = asyncio.create_task(two_turns(through_proxy, fail=True))
        await between.wait()
        await proxy.cut()
        resume.set()  # A fails now; its ending waits on the store (retries of 1, 5, 15 s)
        direct = PostgresLedger(dsn=SecretStr(pg.dsn), db_schema=schema)
        successor: State[str] = await two_turns(direct, fail=False, return_state=True)
        assert successor.is_completed()
        proxy.heal()
        with pytest.raises(Superseded):
            await asyncio.wait_for(cut_off, timeout=60)
    await superseded_by_its_successor("wf-failed-late")
    store = direct.get_store()
    try:
        workflow = await store.get_workflow(str(sim.organization_id), "wf-failed-late")
    finally:
        await store.close()
    assert workflow is not None and workflow.epoch == 2
    assert workflow.state == WorkflowState.FINISHED  # B's end stands; A marked nothing


@pytest.mark.parametrize("when", ["before it begins", "between turns", "at its end"])
async def test_a_run_that_loses_its_store_for_good_ends_crashed_for_the_sweep(
    sim: Simulator, pg: PgCluster, when: str
) -> None:
    """The store stays out of reach through every retry (fleet lab 17/21 and 17/44: a
    host cut off from it for a minute), also when every turn finished and only the
    workflow's end is left to write. Nothing of the workflow failed: the run ends
    Crashed, saying why, and marks nothing failed, so that the sweep relaunches the
    workflow (a Failed run it never relaunches)."""
    schema = f"lost_{uuid4().hex[:8]}"
    workflow_id = f"wf-lost-{when.split()[0]}"
    runs: list[str] = []
    between, resume = asyncio.Event(), asyncio.Event()
    settings = WorkflowSettings(archive_at_end=False, heartbeat_seconds=0.2, tasks=QUICK_RETRIES)

    @flow
    async def two_turns(ledger: PostgresLedger) -> str:
        runs.append(str(flow_run.id))
        async with DurableChat(workflow_id, ledger=ledger, settings=settings) as chat:
            await chat.turn("first")
            if when == "between turns":
                between.set()
            text = (await chat.turn("second")).text
            if when == "at its end":  # both turns stored; the workflow not yet finished
                between.set()
                await resume.wait()
        return text

    async with RoundTripProxy(pg.dsn) as proxy:
        ledger = PostgresLedger(dsn=SecretStr(proxy.dsn), db_schema=schema)
        if when == "before it begins":
            await proxy.cut()
            cut_off = asyncio.create_task(two_turns(ledger))
        else:
            cut_off = asyncio.create_task(two_turns(ledger))
            await between.wait()
            await proxy.cut()
            resume.set()
        with pytest.raises(StoreLost):
            await asyncio.wait_for(cut_off, timeout=90)
        proxy.heal()
    async with get_client() as client:
        state = (await client.read_flow_run(UUID(runs[0]))).state
    assert state is not None and state.is_crashed(), state
    assert "Lost the durable store" in (state.message or "")
    store = PostgresLedger(dsn=SecretStr(pg.dsn), db_schema=schema).get_store()
    try:
        workflow = await store.get_workflow(str(sim.organization_id), workflow_id)
        last = await store.get_step(str(sim.organization_id), workflow_id, 2)
    finally:
        await store.close()
    assert (last is not None) == (when == "at its end")  # a relaunch finds it stored
    if when == "before it begins":
        assert workflow is None
    else:
        assert workflow is not None and workflow.state == WorkflowState.RUNNING


async def test_a_run_of_many_that_loses_its_store_ends_crashed_marking_nothing_failed(
    sim: Simulator, pg: PgCluster
) -> None:
    """``durable_chats`` with its store out of reach through every retry: each workflow is
    left as it was (none marked failed, the sweep would never run it again), and the run
    ends Crashed, saying how many it left, for the sweep to relaunch it whole."""
    schema = f"lost_many_{uuid4().hex[:8]}"
    specs = [WorkflowSpec(workflow_id=f"wf-lost-many-{i}", prompts=["one"]) for i in range(2)]
    async with RoundTripProxy(pg.dsn) as proxy:
        await proxy.cut()
        ledger = PostgresLedger(dsn=SecretStr(proxy.dsn), db_schema=schema)
        with pytest.raises(StoreLost):
            quick = WorkflowSettings(tasks=QUICK_RETRIES)
            lost = durable_chats(workflows=specs, ledger=ledger, settings=quick)
            await asyncio.wait_for(lost, timeout=120)
        proxy.heal()
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["durable-chats"]))
        )
    [run] = [r for r in runs if "wf-lost-many-0" in r.name]
    assert run.state is not None and run.state.is_crashed(), run.state
    assert "2 workflows were left running" in (run.state.message or "")
    store = PostgresLedger(dsn=SecretStr(pg.dsn), db_schema=schema).get_store()
    try:
        for spec in specs:
            assert await store.get_workflow(str(sim.organization_id), spec.workflow_id) is None
    finally:
        await store.close()


async def test_a_workflows_task_settings_pace_what_it_does_between_turns(
    sim: Simulator, pg: PgCluster
) -> None:
    """Its settings say no retry: a workflow whose store is away when it ends does not
    wait out the default 1 + 5 + 15 s for it, though the store is back 3 s later; it ends
    at once, Crashed for the sweep, its turns stored (the defaults would have finished it)."""
    schema = f"paced_{uuid4().hex[:8]}"
    ended, resume = asyncio.Event(), asyncio.Event()
    no_retry = WorkflowSettings(archive_at_end=False, tasks=TaskSettings(retries=0))

    @flow
    async def one_turn(ledger: PostgresLedger) -> str:
        async with DurableChat("wf-paced", ledger=ledger, settings=no_retry) as chat:
            text = (await chat.turn("only")).text
            ended.set()
            await resume.wait()
        return text

    async with RoundTripProxy(pg.dsn) as proxy:
        ledger = PostgresLedger(dsn=SecretStr(proxy.dsn), db_schema=schema)
        run = asyncio.create_task(one_turn(ledger))
        await ended.wait()
        await proxy.cut()
        asyncio.get_running_loop().call_later(3.0, proxy.heal)
        resume.set()
        with pytest.raises(StoreLost):
            await asyncio.wait_for(run, timeout=60)
    store = PostgresLedger(dsn=SecretStr(pg.dsn), db_schema=schema).get_store()
    try:
        workflow = await store.get_workflow(str(sim.organization_id), "wf-paced")
        step = await store.get_step(str(sim.organization_id), "wf-paced", 1)
    finally:
        await store.close()
    assert step is not None
    assert workflow is not None and workflow.state == WorkflowState.RUNNING
