"""Suspended between two turns, the README's example resumes in another process.

A runner in a process of its own serves ``refund_order`` (each flow run in a
subprocess of its own, as a worker runs it). A large refund suspends the run while
a person decides: its process exits. Resumed with the person's answer, the run
starts again in a new process, replays its finished turn from the store and goes
on at the next step; nothing is sent twice and the refund is made once.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.flow_runs import aresume_flow_run

from coder_chat.durable.records import WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator import Simulator
from prefect_coder.payments import Ledger, serve_payments
from tests.flows.support import script_refund, sent
from tests.integration.procs import Processes, managed_processes, until, wait_for_line
from tests.integration.team import serving_env

ROOT = Path(__file__).resolve().parents[2]
SERVE = "from prefect_coder.examples.refund import refund_order; refund_order.serve(name='refunds')"

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.timeout(600)]


@pytest.fixture
async def payments() -> AsyncIterator[tuple[str, Ledger]]:
    async with serve_payments() as served:
        yield served


async def test_a_suspended_run_resumes_in_another_process_at_its_next_step(
    sim: Simulator, tmp_path: Path, payments: tuple[str, Ledger]
) -> None:
    url, ledger = payments
    db = tmp_path / "ledger.sqlite3"
    env = serving_env(sim, tmp_path / "prefect-home", db, PAYMENTS_URL=url)
    script_refund(sim, "11", 30_000)
    async with managed_processes(tmp_path) as procs:
        runner = await procs.start("runner", sys.executable, "-c", SERVE, env=env, cwd=ROOT)
        await wait_for_line(runner, "refunds", 180)
        run = await launch(suspend=True)
        suspended = await state_of(run.id, StateType.PAUSED, procs)
        assert suspended.state is not None and suspended.state.name == "Suspended"
        assert sent(sim, "[refund-11/step-1]") == 1
        assert sent(sim, "[refund-11/step-2]") == 0 and not ledger.applied
        await aresume_flow_run(run.id, run_input={"approved": True})
        done = await state_of(run.id, StateType.COMPLETED, procs)
        # The resumed run's own lines, as its process printed them (the runner streams
        # them): Prefect ships them to its API too, but best-effort and late under load.
        await wait_for_line(runner, r"Workflow refund-11 is finished", 120)
        printed = runner.output()
    assert done.name == "refund-11 · epoch 2"  # begun again, by the resumed run's process
    assert sent(sim, "[refund-11/step-1]") == 1  # replayed from the store, not sent
    assert sent(sim, "[refund-11/step-2]") == 1
    assert list(ledger.applied.values()) == [1]
    # A stored step says so in the flow's own line; a step that ran says it on its
    # task run's Completed state.
    assert " - Step 1: stored" in printed, printed[-3000:]
    assert "Finished in state Completed('Step 2: ran" in printed, printed[-3000:]
    store = SqliteStore(db)
    try:
        workflow = await store.get_workflow(str(sim.organization_id), "refund-11")
    finally:
        await store.close()
    assert workflow is not None and workflow.state == WorkflowState.FINISHED


async def launch(*, suspend: bool) -> FlowRun:
    async with get_client() as client:
        deployment = await client.read_deployment_by_name("refund-order/refunds")
        return await client.create_flow_run_from_deployment(
            deployment.id,
            parameters={"order_id": "11", "complaint": "It never came", "suspend": suspend},
        )


async def state_of(run_id: UUID, state: StateType, procs: Processes) -> FlowRun:
    async def reached() -> FlowRun | None:
        async with get_client() as client:
            run = await client.read_flow_run(run_id)
        assert run.state_type not in (StateType.FAILED, StateType.CRASHED), run.state
        return run if run.state_type == state else None

    return await until(reached, f"the run to be {state.value}", 240, procs.started, 0.5)
