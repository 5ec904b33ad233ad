"""The orphan_sweep flow on Prefect's test API: artifact, dry run, and stranded workflows."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.client.orchestration import get_client

from coder_chat.durable.markers import chat_labels
from coder_chat.durable.records import WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator import Simulator
from prefect_coder.flows.durable_chat import durable_chat
from prefect_coder.flows.orphan_sweep import orphan_sweep
from tests.simulator.wire import Wire

pytestmark = pytest.mark.usefixtures("prefect_api")


async def test_the_flow_retires_orphans_and_reports(sim: Simulator, coder_env: Path) -> None:
    store = SqliteStore(coder_env)
    labels = chat_labels("wf-lost", 1, "nightly", await store.store_id())
    await store.close()
    async with Wire(sim) as wire:
        orphan = (await wire.create("lost", labels=labels))["id"]
        await sim.wait_for_status(orphan, "waiting")
    dry = await orphan_sweep(target_deployment="nightly", orphan_age_seconds=0, dry_run=True)
    assert dry == {"chats": 1, "acted": 1, "stranded": 0, "relaunched": 0}
    assert not sim.chat(orphan).archived
    summary = await orphan_sweep(target_deployment="nightly", orphan_age_seconds=0)
    assert summary["acted"] == 1 and sim.chat(orphan).archived
    async with get_client() as client:
        artifacts = await client.read_latest_artifacts()
    table = [a for a in artifacts if a.key == "orphan-sweep-nightly"]
    assert table and orphan in str(table[0].data)


async def test_stranded_workflows_outside_a_deployment_are_reported_not_relaunched(
    sim: Simulator, coder_env: Path
) -> None:
    store = SqliteStore(coder_env)
    await store.begin_run(
        str(sim.organization_id), "wf-stranded", deployment="nightly", flow_run_id=None
    )
    await store.close()
    summary = await orphan_sweep(target_deployment="nightly", stale_heartbeat_seconds=0)
    assert summary["stranded"] == 1 and summary["relaunched"] == 0


async def test_a_workflow_whose_run_failed_is_never_relaunched(
    sim: Simulator, coder_env: Path
) -> None:
    """Its failure hook could not mark it (the store still says running, the heartbeat
    went quiet): the sweep reads the run's Failed state, marks it failed itself, and
    relaunches nothing. A failed run would only fail again."""
    state = await durable_chat(
        workflow_id="wf-failed-run",
        prompts=["x"],
        tools=["tests.flows.no_such_module:tool"],
        return_state=True,
    )
    assert state.is_failed()
    tenant = str(sim.organization_id)
    store = SqliteStore(coder_env)
    ended = await store.get_workflow(tenant, "wf-failed-run")
    assert ended is not None and ended.state == WorkflowState.FAILED  # the hook's work
    flow_run_id = str(state.state_details.flow_run_id)
    await store.begin_run(tenant, "wf-failed-run", deployment="local", flow_run_id=flow_run_id)
    await store.close()
    summary = await orphan_sweep(target_deployment="local", stale_heartbeat_seconds=0)
    assert summary["stranded"] == 0 and summary["relaunched"] == 0
    store = SqliteStore(coder_env)
    after = await store.get_workflow(tenant, "wf-failed-run")
    await store.close()
    assert after is not None and after.state == WorkflowState.FAILED
