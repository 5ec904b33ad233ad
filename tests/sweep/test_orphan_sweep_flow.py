"""The orphan_sweep flow on Prefect's test API: artifact, dry run, and stranded workflows."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.objects import FlowRun, State, StateType
from prefect.states import Cancelling, Crashed, Failed, Pending, Running, Suspended

from coder_chat.durable.markers import chat_labels
from coder_chat.durable.records import WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.sweep import sweep_workflow_id
from coder_chat.simulator import Simulator
from prefect_coder.examples.refund import refund_order
from prefect_coder.flows.durable_chat import durable_chat
from prefect_coder.flows.orphan_sweep import orphan_sweep
from prefect_coder.tasks.lost_runs import replaces_tag
from tests.integration.procs import until
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
    assert dry == {"chats": 1, "acted": 1, "stranded": 0, "relaunched": 0, "cancelled": 0}
    assert not sim.chat(orphan).archived
    summary = await orphan_sweep(target_deployment="nightly", orphan_age_seconds=0)
    assert summary["acted"] == 1 and sim.chat(orphan).archived
    async with get_client() as client:
        artifacts = await client.read_latest_artifacts()
    table = [a for a in artifacts if a.key == "orphan-sweep-nightly"]
    assert table and orphan in str(table[0].data)


async def begun(
    sim: Simulator, coder_env: Path, workflow_id: str, deployment: str, flow_run_id: str | None
) -> None:
    """The workflow begun in the store as ``flow_run_id``'s, running, its heartbeat now
    stale (its process gone)."""
    store = SqliteStore(coder_env)
    tenant = str(sim.organization_id)
    await store.begin_run(tenant, workflow_id, deployment=deployment, flow_run_id=flow_run_id)
    await store.close()


async def test_stranded_workflows_outside_a_deployment_are_reported_not_relaunched(
    sim: Simulator, coder_env: Path
) -> None:
    await begun(sim, coder_env, "wf-stranded", "nightly", flow_run_id=None)
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


async def a_deployed_run(workflow_id: str, state: State[Any]) -> FlowRun:
    """A flow run of the README's own-flow example, from a deployment of it, left in
    ``state``; a test that wants its workflow begun as that run's says so (``begun``)."""
    deployment_id = await (await refund_order.ato_deployment(name="shop-refunds")).aapply()
    async with get_client() as client:
        return await client.create_flow_run_from_deployment(
            deployment_id,
            parameters={"order_id": workflow_id.removeprefix("refund-"), "complaint": "late"},
            state=state,
        )


async def test_a_users_own_flow_is_relaunched_from_its_deployment(
    sim: Simulator, coder_env: Path
) -> None:
    run = await a_deployed_run("refund-5", Crashed())
    await begun(sim, coder_env, "refund-5", "shop-refunds", flow_run_id=str(run.id))
    summary = await orphan_sweep(target_deployment="shop-refunds", stale_heartbeat_seconds=0)
    assert summary["stranded"] == 1 and summary["relaunched"] == 1
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=["prefect-coder:relaunch:refund-5"])
            )
        )
    [relaunched] = runs
    assert relaunched.deployment_id == run.deployment_id
    assert relaunched.parameters == run.parameters  # the same workflow, the same inputs
    # The next pass finds the relaunch still waiting for a worker: it is on its way.
    again = await orphan_sweep(target_deployment="shop-refunds", stale_heartbeat_seconds=0)
    assert again["stranded"] == 1 and again["relaunched"] == 0
    # Once it has waited longer than a relaunch may take to begin (its host cut off from
    # the store, say), it is taken for lost and the workflow is relaunched again.
    lost = await orphan_sweep(
        target_deployment="shop-refunds", stale_heartbeat_seconds=0, relaunch_start_seconds=0
    )
    assert lost["stranded"] == 1 and lost["relaunched"] == 1


async def test_a_paused_or_suspended_run_is_waiting_not_stranded(
    sim: Simulator, coder_env: Path
) -> None:
    """Suspended between turns, a run's process is gone and its heartbeat stops: it is
    waiting for a person, not stranded, and the sweep leaves it to be resumed."""
    run = await a_deployed_run("refund-6", Suspended())
    await begun(sim, coder_env, "refund-6", "shop-refunds", flow_run_id=str(run.id))
    summary = await orphan_sweep(target_deployment="shop-refunds", stale_heartbeat_seconds=0)
    assert summary["stranded"] == 0 and summary["relaunched"] == 0


async def test_one_pass_at_a_time_and_a_dead_pass_is_taken_over(
    sim: Simulator, coder_env: Path
) -> None:
    """A pass whose lease is alive (its heartbeat fresh) makes another do nothing; once
    that heartbeat is older than the lease (its host died), the next pass takes over."""
    store = SqliteStore(coder_env)
    tenant = str(sim.organization_id)
    labels = chat_labels("wf-gone", 1, "leased", await store.store_id())
    await store.begin_run(tenant, sweep_workflow_id("leased"), flow_run_id="a-live-pass")
    await store.close()
    async with Wire(sim) as wire:
        orphan = (await wire.create("lost", labels=labels))["id"]
        await sim.wait_for_status(orphan, "waiting")
    busy = await orphan_sweep(target_deployment="leased", orphan_age_seconds=0)
    assert busy["acted"] == 0 and not sim.chat(orphan).archived
    taken = await orphan_sweep(target_deployment="leased", orphan_age_seconds=0, lease_seconds=0)
    assert taken["acted"] == 1 and sim.chat(orphan).archived


async def test_a_run_left_running_before_it_began_its_workflow_is_relaunched_in_time(
    sim: Simulator, coder_env: Path
) -> None:
    """Its host died while it started: Prefect shows it Running for good, and the store
    never heard of its workflow. Within relaunch_start_seconds it may still be starting
    and is left alone; past it, it is marked Crashed and launched again, once."""
    stuck = await a_deployed_run("refund-31", Running())
    young = await orphan_sweep(target_deployment="shop-refunds")
    old = await orphan_sweep(target_deployment="shop-refunds", relaunch_start_seconds=0)
    again = await orphan_sweep(target_deployment="shop-refunds", relaunch_start_seconds=0)
    assert (young["relaunched"], old["relaunched"], again["relaunched"]) == (0, 1, 0)
    async with get_client() as client:
        marked = await client.read_flow_run(stuck.id)
        [relaunch] = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[replaces_tag(stuck.id)]))
        )
    assert marked.state is not None and marked.state.type == StateType.CRASHED
    assert relaunch.parameters == stuck.parameters


async def test_a_run_pending_is_lost_only_once_it_had_the_time_to_start(
    sim: Simulator, coder_env: Path
) -> None:
    """Its worker took it and died before its process began (or its host is slow): Prefect
    shows it Pending. Silent past the stale-heartbeat limit it may still be starting (a
    loaded host took 68 s), and a run launched again while it starts runs twice; past
    relaunch_start_seconds it is marked Crashed, saying so, and launched again once."""
    pending = await a_deployed_run("refund-33", Pending())
    silent = await orphan_sweep(target_deployment="shop-refunds", stale_heartbeat_seconds=0)
    lost = await orphan_sweep(target_deployment="shop-refunds", relaunch_start_seconds=0)
    again = await orphan_sweep(target_deployment="shop-refunds", relaunch_start_seconds=0)
    assert (silent["relaunched"], lost["relaunched"], again["relaunched"]) == (0, 1, 0)
    async with get_client() as client:
        marked = (await client.read_flow_run(pending.id)).state
    assert marked is not None and marked.type == StateType.CRASHED, marked
    assert (
        marked.message == "Lost before it began its workflow (it never left Pending); relaunched."
    )


@pytest.mark.parametrize("pass_started_by", ["schedule", "silence"])
async def test_a_run_left_running_after_its_workflow_ended_is_marked_and_not_relaunched(
    sim: Simulator, coder_env: Path, pass_started_by: str
) -> None:
    """Its process stopped between finishing the workflow and telling Prefect: the store
    says finished, Prefect says Running for good. The sweep marks it Crashed, saying the
    workflow had finished, and launches nothing: a scheduled pass, and one the run's
    silence started (which takes the run it names for dead first; fleet campaign 28/20)."""
    run = await a_deployed_run("refund-41", Running())
    async with get_client() as client:  # named and tagged after its workflow, as it began it
        await client.update_flow_run(
            run.id, name="refund-41 · epoch 1", tags=[*run.tags, "workflow:refund-41"]
        )
    store = SqliteStore(coder_env)
    tenant = str(sim.organization_id)
    fence = await store.begin_run(
        tenant, "refund-41", deployment="shop-refunds", flow_run_id=str(run.id)
    )
    await store.finish(fence, WorkflowState.FINISHED)
    await store.close()
    silent = {"silent_flow_run": f"prefect.flow-run.{run.id}", "because": "its pulse stopped"}
    extra: dict[str, Any] = silent if pass_started_by == "silence" else {}
    summary = await orphan_sweep(
        target_deployment="shop-refunds", relaunch_start_seconds=0, **extra
    )
    assert summary["relaunched"] == 0
    async with get_client() as client:
        marked = await client.read_flow_run(run.id)
        relaunches = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[replaces_tag(run.id)]))
        )
    assert marked.state is not None and marked.state.type == StateType.CRASHED
    assert "workflow refund-41 finished" in (marked.state.message or "")
    assert relaunches == []


async def test_a_run_that_failed_to_reach_the_api_as_it_started_is_relaunched(
    sim: Simulator, coder_env: Path
) -> None:
    """Prefect's API was out of reach while the run resolved its saved blocks: it failed
    before anything of the flow ran. It is lost, not failed, and launched again once; a
    run that failed for a reason of its own is not (it would only fail again)."""
    unreached: State[Any] = Failed(
        message="Validation of flow parameters failed with error: ConnectError: [Errno 113] "
        "No route to host"
    )
    lost = await a_deployed_run("refund-51", unreached)
    await a_deployed_run("refund-52", Failed(message="ValueError: no such order"))
    summary = await orphan_sweep(target_deployment="shop-refunds")
    assert summary["relaunched"] == 1
    async with get_client() as client:
        [relaunch] = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[replaces_tag(lost.id)]))
        )
    assert relaunch.parameters == lost.parameters


async def test_a_run_lost_before_it_began_its_workflow_is_relaunched_once(
    sim: Simulator, coder_env: Path
) -> None:
    """The store never heard of its workflow (the run crashed as it started), so only
    Prefect knows: a crashed run still named as Prefect named it is launched again, once;
    one that began its workflow (renamed after it) is the stranded path's to judge."""
    lost = await a_deployed_run("refund-21", Crashed())
    began = await a_deployed_run("refund-22", Crashed())
    async with get_client() as client:
        await client.update_flow_run(began.id, name="refund-22 · epoch 1")
    first = await orphan_sweep(target_deployment="shop-refunds")
    again = await orphan_sweep(target_deployment="shop-refunds")
    assert (first["relaunched"], again["relaunched"]) == (1, 0)
    async with get_client() as client:
        [relaunch] = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[replaces_tag(lost.id)]))
        )
        others = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[replaces_tag(began.id)]))
        )
    assert relaunch.parameters == lost.parameters and others == []


async def test_a_cancelled_run_whose_process_is_gone_is_ended_cancelled(
    sim: Simulator, coder_env: Path
) -> None:
    """A person cancelled it, then its host died before the cancel was carried out: no
    worker is left to end it, and it would read Cancelling for good (fleet campaign 29/6).
    A cancel younger than the stale-heartbeat limit is left to the run and its worker; past
    it, with nothing heard from the run, the sweep ends it Cancelled and says why."""
    run = await a_deployed_run("refund-71", Cancelling())
    await orphan_sweep(target_deployment="shop-refunds")
    async with get_client() as client:
        young = (await client.read_flow_run(run.id)).state
    assert young is not None and young.type == StateType.CANCELLING, young
    await orphan_sweep(target_deployment="shop-refunds", stale_heartbeat_seconds=0)
    async with get_client() as client:
        ended = (await client.read_flow_run(run.id)).state
    assert ended is not None and ended.type == StateType.CANCELLED, ended
    assert (ended.message or "").startswith("Cancelled by a person. Its process stopped")
    assert (ended.message or "").endswith("; it held no workflow."), ended.message


async def test_a_cancelled_run_holding_its_workflow_is_ended_once_the_workflow_is(
    sim: Simulator, coder_env: Path
) -> None:
    """The same run, holding its workflow: the pass that sees the cancel ends the workflow
    first, then the run, and the run's message says what became of the workflow."""
    run = await a_deployed_run("refund-72", Cancelling())
    await begun(sim, coder_env, "refund-72", "shop-refunds", flow_run_id=str(run.id))
    await orphan_sweep(target_deployment="shop-refunds", stale_heartbeat_seconds=0)
    store = SqliteStore(coder_env)
    workflow = await store.get_workflow(str(sim.organization_id), "refund-72")
    await store.close()
    assert workflow is not None and workflow.state == WorkflowState.CANCELLED, workflow
    async with get_client() as client:
        ended = (await client.read_flow_run(run.id)).state
    assert ended is not None and ended.type == StateType.CANCELLED, ended
    assert (ended.message or "").endswith("; its workflow was ended for the cancel."), ended


async def test_a_run_said_silent_that_pulses_since_is_left_alive(
    sim: Simulator, coder_env: Path
) -> None:
    """A pass its silence started finds the run pulsing (its trigger fired while Prefect's
    server was away, say, and the run's pulses came after): the run is alive, left Running,
    and nothing is relaunched. Prefect's own heartbeat plays no part: none is sent here."""
    run = await a_deployed_run("refund-43", Running())
    await begun(sim, coder_env, "refund-43", "shop-refunds", flow_run_id=str(run.id))
    async with get_client() as client:
        await pulse_heard(client, run.id)
        summary = await orphan_sweep(
            target_deployment="shop-refunds",
            relaunch_start_seconds=0,
            silent_flow_run=f"prefect.flow-run.{run.id}",
            because="its pulse stopped",
        )
        still = await client.read_flow_run(run.id)
        relaunches = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[replaces_tag(run.id)]))
        )
    assert summary["relaunched"] == 0 and relaunches == []
    assert still.state is not None and still.state.type == StateType.RUNNING, still.state


#: The event a live run sends, as the shipped YAML's triggers name it.
PULSE = "prefect-coder.flow-run.pulse"


async def pulse_heard(client: PrefectClient, run_id: UUID) -> None:
    """A pulse of ``run_id`` sent to Prefect's API now, and read back from its events (the
    server records events a little after it takes them)."""
    resource = f"prefect.flow-run.{run_id}"
    pulse: dict[str, Any] = {
        "id": str(uuid4()),
        "occurred": datetime.now(UTC).isoformat(),
        "event": PULSE,
        "resource": {"prefect.resource.id": resource},
    }
    (await client.request("POST", "/events", json=[pulse])).raise_for_status()
    wanted = {"event": {"name": [PULSE]}, "resource": {"id": [resource]}}

    async def recorded() -> bool:
        found = await client.request("POST", "/events/filter", json={"filter": wanted})
        return bool(found.json()["events"])

    await until(recorded, f"Prefect's API to record the pulse of run {run_id}", 10.0, [], 0.1)
