"""The deployments end to end: a real ``prefect server``, ``prefect deploy``, process workers.

Everything is a real process except the test's own peers (the Coder simulator and
the payments fake, served from this event loop over loopback sockets):

1. ``prefect server start`` (no UI, no scheduler) with its own ``PREFECT_HOME``;
2. ``prefect work-pool create`` and ``prefect deploy --all --prefect-file
   deployments/prefect.yaml`` from the repository root, then the three deployments,
   the sweep's schedule and its concurrency limit are read back through the API;
3. a process worker runs ``durable-chat``; its first turn charges a card, and the
   worker is SIGKILLed with everything it started (its own process group and the
   flow run's, which Prefect puts in a session of its own) while the tool's result
   is on its way to Coder: an orphan chat is left paused on the call, with no
   checkpoint;
4. a fresh worker runs a second, live workflow whose chat is checkpointed and
   mid-turn while the sweep runs;
5. a triggered ``orphan-sweep`` run (short budgets) finds the crashed workflow's
   heartbeat stale and relaunches it from its deployment; the relaunch adopts the
   orphan, answers the paused call from the tool ledger, completes every step once
   and archives the chat at the end.

The checks read the simulator's and the payments fake's own records, the durable
store and the Prefect API; nothing in the code under test is patched.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterTags,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.responses import DeploymentResponse
from prefect.settings import PREFECT_API_URL

from coder_chat.durable.markers import LABEL_WORKFLOW, step_marker
from coder_chat.durable.records import WorkflowRecord, WorkflowState, ledger_key, utcnow
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.step import StepResult
from coder_chat.simulator import Simulator, SimulatorConfig, serve_simulator
from coder_chat.simulator.state import Chat
from prefect_coder.payments import Ledger, serve_payments
from tests.integration.procs import NEEDS_PROC, Proc, Processes, clean_env, until
from tests.integration.stack import POOL, PREFECT, ROOT, deploy_all, start_server, start_worker
from tests.names import run_name
from tests.prefect_test_api import api_settings

CHARGE_CARD = "prefect_coder.demo_tools:charge_card"
#: A workflow whose heartbeat is older than this is stranded (the sweep's budget here).
STALE_SECONDS = 4.0
#: How long the live workflow's second turn runs on the server: long enough that
#: the sweep, its pick-up and its start all happen while the turn is live.
LIVE_TURN_SECONDS = 45
#: Generous bounds for anything that waits on a cold process (Python + Prefect imports).
STARTUP_TIMEOUT = 120.0
RUN_TIMEOUT = 240.0
TERMINAL = frozenset(
    {StateType.COMPLETED, StateType.FAILED, StateType.CRASHED, StateType.CANCELLED}
)

pytestmark = [pytest.mark.timeout(900), NEEDS_PROC]

T = TypeVar("T")


# -- the peers' records -------------------------------------------------------------------------


def chats_of(sim: Simulator, workflow_id: str) -> list[Chat]:
    return [c for c in sim.chats() if c.labels.get(LABEL_WORKFLOW) == workflow_id]


def marker_counts(sim: Simulator, chat: Chat, workflow_id: str, steps: int) -> list[int]:
    """Per step, how many user messages of the chat carry the step's marker."""
    users = [m for m in sim.messages(chat.id) if m.role == "user"]
    return [
        sum(1 for m in users if step_marker(workflow_id, step) in m.text())
        for step in range(1, steps + 1)
    ]


def committed_answers(sim: Simulator, chat: Chat, workflow_id: str, steps: int) -> list[str]:
    """Per step, the text of the last assistant message the server committed for it."""
    answers: dict[int, str] = {}
    step = 0
    for message in sim.messages(chat.id):
        if message.role == "user":
            step = next(
                (n for n in range(1, steps + 1) if step_marker(workflow_id, n) in message.text()),
                0,
            )
        elif message.role == "assistant" and message.text() and step:
            answers[step] = message.text()
    return [answers.get(n, "") for n in range(1, steps + 1)]


async def wait_state(
    client: PrefectClient, run_id: uuid.UUID, watch: list[Proc], timeout: float = RUN_TIMEOUT
) -> FlowRun:
    async def ended() -> FlowRun | None:
        run = await client.read_flow_run(run_id)
        return run if run.state is not None and run.state.type in TERMINAL else None

    return await until(ended, f"flow run {run_id} to end", timeout, watch, interval=0.5)


async def still_running(client: PrefectClient, run_id: uuid.UUID) -> None:
    run = await client.read_flow_run(run_id)
    assert run.state is None or run.state.type not in TERMINAL, f"flow run {run_id}: {run.state}"


async def flow_run_logs(client: PrefectClient, run_id: uuid.UUID) -> list[str]:
    logs = await client.read_logs(
        log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])), limit=200
    )
    return [log.message for log in logs]


async def relaunches(client: PrefectClient, workflow_id: str) -> list[FlowRun]:
    tag = f"prefect-coder:relaunch:{workflow_id}"
    return await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag]))
    )


# -- the test -----------------------------------------------------------------------------------


async def test_deploy_crash_sweep_and_relaunch(tmp_path: Path) -> None:
    procs = Processes(tmp_path)
    try:
        await scenario(procs, tmp_path)
        await procs.close()
        # A process SIGKILLed is gone once the kernel has torn it down: a big one, on a
        # loaded machine, can take a moment; one that is still there after this survived.
        await until(
            procs.all_dead, "the killed processes to die (none may survive SIGKILL)", 30, []
        )
    except BaseException:
        print(procs.diagnostics())
        raise
    finally:
        await procs.close()


async def scenario(procs: Processes, tmp: Path) -> None:
    # 1. A real Prefect server of its own (only the runs this test triggers happen).
    server_env = {
        **clean_env(),
        "PREFECT_HOME": str(tmp / "server-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    server = await start_server(procs, tmp, server_env, database=None)
    await server.healthy(STARTUP_TIMEOUT)
    api = server.api

    # 2. Deploy from the YAML, from the repository root, as a user would.
    cli_env = {
        **clean_env(),
        "PREFECT_API_URL": api,
        "PREFECT_HOME": str(tmp / "cli-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    create_pool = ["work-pool", "create", POOL, "--type", "process"]
    await procs.run("work-pool", PREFECT, *create_pool, env=cli_env, cwd=ROOT)
    await deploy_all(procs, cli_env, [server.proc])
    async with api_settings({PREFECT_API_URL: api}), get_client() as client:
        await with_deployments(procs, client, tmp, server.proc)


@dataclass
class Scene:
    """What every phase of the scenario acts on: the deployed stack and the peers."""

    procs: Processes
    client: PrefectClient
    tmp: Path
    server: Proc
    sim: Simulator
    payments: Ledger
    store: SqliteStore
    worker_env: dict[str, str]
    durable: DeploymentResponse
    sweep: DeploymentResponse

    @property
    def tenant(self) -> str:
        return str(self.sim.organization_id)

    async def workflow(self, workflow_id: str) -> WorkflowRecord | None:
        return await self.store.get_workflow(self.tenant, workflow_id)

    async def start_worker(self, name: str) -> Proc:
        return await start_worker(self.procs, self.worker_env, self.tmp, name)


@dataclass
class Crashed:
    """The workflow whose first worker was killed with a tool result on its way to Coder."""

    workflow_id: str
    params: dict[str, Any]
    run: FlowRun
    orphan: Chat


@dataclass
class Live:
    """The workflow that is checkpointed and mid-turn when the sweep runs."""

    workflow_id: str
    run: FlowRun
    chat: Chat


async def with_deployments(
    procs: Processes, client: PrefectClient, tmp: Path, server: Proc
) -> None:
    durable, sweep = await check_the_deployments(client)
    config = SimulatorConfig(interrupt_winddown=0.05)
    async with serve_simulator(config) as sim, serve_payments() as (payments_url, payments):
        db = tmp / "ledger.sqlite3"
        worker_env = {
            **clean_env(),
            **sim.env(),
            "PAYMENTS_URL": payments_url,
            "PREFECT_CODER_SQLITE_PATH": str(db),
            "PREFECT_API_URL": str(PREFECT_API_URL.value()),
            # Shared by every worker: Prefect keeps the step cache (task results) here.
            "PREFECT_HOME": str(tmp / "worker-home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        store = SqliteStore(db)
        scene = Scene(procs, client, tmp, server, sim, payments, store, worker_env, durable, sweep)
        try:
            crashed = await crash_the_first_worker(scene)
            second = await scene.start_worker("worker-2")
            live = await start_a_live_workflow(scene, second)
            relaunch = await sweep_once(scene, crashed, live, second)
            await check_the_relaunch(scene, crashed, relaunch, second)
            await check_the_live_workflow(scene, live, second)
        finally:
            await store.close()


async def check_the_deployments(
    client: PrefectClient,
) -> tuple[DeploymentResponse, DeploymentResponse]:
    """Every deployment of the YAML, as the YAML says; the sweep's schedule paused."""
    durable = await client.read_deployment_by_name("durable-chat/durable-chat")
    sweep = await client.read_deployment_by_name("orphan-sweep/orphan-sweep")
    archive = await client.read_deployment_by_name("archive-workflow/archive-workflow")
    prune = await client.read_deployment_by_name("prune-workflows/prune-workflows")
    assert durable.entrypoint == "prefect_coder.flows.durable_chat:durable_chat"
    assert sweep.entrypoint == "prefect_coder.flows.orphan_sweep:orphan_sweep"
    assert archive.entrypoint == "prefect_coder.flows.archive_workflow:archive_workflow"
    assert prune.entrypoint == "prefect_coder.flows.prune_workflows:prune_workflows"
    assert prune.parameters == {"older_than_days": 30}
    [daily] = prune.schedules
    assert getattr(daily.schedule, "cron", None) == "30 3 * * *"
    for deployment in (durable, sweep, archive, prune):
        assert deployment.work_pool_name == POOL
        assert deployment.enforce_parameter_schema
    assert sweep.parameters == {"target_deployment": "durable-chat"}
    [schedule] = sweep.schedules
    assert schedule.active
    assert getattr(schedule.schedule, "cron", None) == "*/5 * * * *"
    assert getattr(schedule.schedule, "timezone", None) == "UTC"
    # One pass at a time is the sweep's own lease, not a slot a dead host could keep.
    assert sweep.global_concurrency_limit is None
    # The server runs no scheduler; pause the schedule as well, so that only the
    # sweep this test triggers ever runs.
    await client.update_deployment_schedule(sweep.id, schedule.id, active=False)
    return durable, sweep


async def crash_the_first_worker(scene: Scene) -> Crashed:
    """3. The first worker runs a workflow whose first turn charges a card; the tool's
    result is held on its way to Coder and the worker is killed."""
    client, sim = scene.client, scene.sim
    crashed_id = f"it-crash-{uuid.uuid4().hex[:8]}"
    params: dict[str, Any] = {
        "workflow_id": crashed_id,
        "prompts": [
            'charge the customer /tool charge_card {"amount_cents": 500}',
            "write the customer a receipt note",
            "say goodbye",
        ],
        "tools": [CHARGE_CARD],
        "settings": {
            "request_timeout_seconds": 30.0,
            "step_deadline_seconds": 60.0,
            "heartbeat_seconds": 1.0,
        },
    }
    first = await scene.start_worker("worker-1")
    sim.faults.hold("tool_results", phase="before")
    run = await client.create_flow_run_from_deployment(scene.durable.id, parameters=params)

    async def held_result() -> Any:
        await still_running(client, run.id)
        return next((h for h in sim.faults.held() if h.route == "tool_results"), None)

    watch = [first, scene.server]
    held = await until(held_result, "the tool result to be held", STARTUP_TIMEOUT, watch)
    assert list(scene.payments.applied.values()) == [1], scene.payments.applied
    await scene.procs.crash(first)  # the worker and its flow run's process, at once
    sim.faults.decide(held.id, "drop")  # the dead worker's request never lands
    await until(scene.procs.all_dead, "the crashed worker's processes to die", 30, [])

    [orphan] = chats_of(sim, crashed_id)
    assert orphan.status == "requires_action" and not orphan.archived
    record = await scene.workflow(crashed_id)
    assert record is not None
    assert record.state == WorkflowState.RUNNING and record.epoch == 1
    assert record.chat_id is None, "the crashed first turn wrote no checkpoint"
    assert record.flow_run_id == str(run.id)
    return Crashed(crashed_id, params, run, orphan)


async def start_a_live_workflow(scene: Scene, second: Proc) -> Live:
    """4. A fresh worker, and a live workflow, checkpointed and mid-turn."""
    client, sim = scene.client, scene.sim
    live_id = f"it-live-{uuid.uuid4().hex[:8]}"
    params: dict[str, Any] = {
        "workflow_id": live_id,
        "prompts": ["hello", f"/sleep {LIVE_TURN_SECONDS} take your time"],
        "settings": {
            "request_timeout_seconds": 120.0,
            "step_deadline_seconds": 180.0,
            "heartbeat_seconds": 1.0,
            "archive_at_end": False,
        },
    }
    run = await client.create_flow_run_from_deployment(scene.durable.id, parameters=params)

    async def live_mid_turn() -> Chat | None:
        await still_running(client, run.id)
        chats = chats_of(sim, live_id)
        if len(chats) != 1 or chats[0].status != "running":
            return None
        if marker_counts(sim, chats[0], live_id, 2)[1] != 1:
            return None
        return chats[0]

    watch = [second, scene.server]
    chat = await until(live_mid_turn, "the live workflow's second turn", STARTUP_TIMEOUT, watch)
    record = await scene.workflow(live_id)
    assert record is not None and record.chat_id == str(chat.id)
    assert record.epoch == 1
    return Live(live_id, run, chat)


async def sweep_once(scene: Scene, crashed: Crashed, live: Live, second: Proc) -> FlowRun:
    """5. The sweep, with short budgets, once the crashed workflow's heartbeat is stale:
    it keeps the live chat and relaunches the crashed workflow (the pass the test starts,
    or one the crash's events started first, which the test's pass then leaves be)."""
    client = scene.client

    async def crashed_is_stale() -> bool:
        found = await scene.workflow(crashed.workflow_id)
        assert found is not None
        beat = found.heartbeat_at
        return beat is None or utcnow() - beat > timedelta(seconds=STALE_SECONDS + 1)

    await until(crashed_is_stale, "the crashed workflow's heartbeat to go stale", 60, [])
    sweep_run = await client.create_flow_run_from_deployment(
        scene.sweep.id,
        parameters={
            "target_deployment": "durable-chat",
            "orphan_age_seconds": 0.0,
            "stuck_after_seconds": 3600.0,
            "stale_heartbeat_seconds": STALE_SECONDS,
            "tools": [CHARGE_CARD],
        },
    )
    swept = await wait_state(client, sweep_run.id, [second, scene.server])
    assert swept.state is not None and swept.state.type == StateType.COMPLETED, swept.state

    async def sweep_saw_live() -> list[str] | None:
        # Any pass: the crash's own events may have started one first, and then the
        # test's pass found it going and did nothing.
        passes = await client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[scene.sweep.id]))
        )
        kept = f"kept: owned by the checkpoint of workflow {live.workflow_id}"
        for sweep_pass in passes:
            lines = await flow_run_logs(client, sweep_pass.id)
            found = [line for line in lines if str(live.chat.id) in line and kept in line]
            if found:
                return found
        return None

    await until(sweep_saw_live, "the sweep's log of the live chat", 60, [second])

    async def relaunched() -> FlowRun | None:
        runs = await relaunches(client, crashed.workflow_id)
        return runs[0] if runs else None

    relaunch = await until(relaunched, "the relaunch", 60, [second, scene.server])
    assert relaunch.deployment_id == scene.durable.id
    assert relaunch.parameters == crashed.params
    return relaunch


async def check_the_relaunch(
    scene: Scene, crashed: Crashed, relaunch: FlowRun, second: Proc
) -> None:
    """6. The relaunch adopts the orphan, completes every step, archives the chat."""
    client, sim, orphan, crashed_id = scene.client, scene.sim, crashed.orphan, crashed.workflow_id
    done = await wait_state(client, relaunch.id, [second, scene.server])
    assert done.state is not None and done.state.type == StateType.COMPLETED, done.state
    assert [r.id for r in await relaunches(client, crashed_id)] == [relaunch.id]
    assert chats_of(sim, crashed_id) == [orphan], "the relaunch adopted the orphan"
    assert sim.chat(orphan.id).archived  # once, at the workflow's end
    assert [a.archived for a in sim.records.archives if a.chat_id == orphan.id] == [True]
    assert marker_counts(sim, orphan, crashed_id, 3) == [1, 1, 1]
    record = await scene.workflow(crashed_id)
    assert record is not None
    assert record.state == WorkflowState.FINISHED and record.epoch == 2
    assert record.chat_id == str(orphan.id)
    assert record.flow_run_id == str(relaunch.id)
    # The runs say what became of them: the relaunch is named by workflow and
    # epoch, and the dead run it replaced is superseded, naming its successor.
    assert done.name == run_name(crashed_id, 2)
    dead = await client.read_flow_run(crashed.run.id)
    assert dead.state is not None and dead.state.type == StateType.CANCELLED, dead.state
    assert dead.state.name == "Superseded"
    assert run_name(crashed_id, 2) in (dead.state.message or "")
    assert any("superseded by run" in line for line in await flow_run_logs(client, dead.id))
    await check_the_relaunch_charged_once(scene, crashed, relaunch)


async def check_the_relaunch_charged_once(
    scene: Scene, crashed: Crashed, relaunch: FlowRun
) -> None:
    """Every tool effect once: one charge, under the orphan's ledger key; and the steps
    the relaunched run returned, each once, in order."""
    client, sim, payments, orphan = scene.client, scene.sim, scene.payments, crashed.orphan
    [key] = payments.applied
    assert payments.applied[key] == 1
    [result] = [r for r in sim.records.tool_results if r.chat_id == orphan.id]
    assert not result.synthetic and not result.is_error
    assert key == ledger_key(scene.tenant, str(orphan.id), result.tool_call_id)
    assert payments.receipts[key] in str(result.output)
    verdicts = await transcript_verdicts(client, crashed.workflow_id)
    assert verdicts == [("1", "recovered"), ("2", "ran"), ("3", "ran")]
    # ... and the step results it returned, as persisted by Prefect (the step
    # cache): each once, and each what the server committed for its step.
    steps = await turn_results(client, relaunch.id)
    assert all(isinstance(s, StepResult) for s in steps), steps
    assert [(s.step, s.verdict, s.chat_id) for s in steps] == [
        (1, "recovered", str(orphan.id)),
        (2, "ran", str(orphan.id)),
        (3, "ran", str(orphan.id)),
    ]
    assert [s.text for s in steps] == committed_answers(sim, orphan, crashed.workflow_id, 3)
    assert payments.receipts[key] in steps[0].text


async def check_the_live_workflow(scene: Scene, live: Live, second: Proc) -> None:
    """7. The live workflow was left alone: it finishes its own turn."""
    client, sim, chat = scene.client, scene.sim, live.chat
    assert await relaunches(client, live.workflow_id) == []
    done = await wait_state(client, live.run.id, [second, scene.server])
    assert done.state is not None
    assert done.state.type == StateType.COMPLETED, done.state
    assert [i for i in sim.records.interrupts if i.chat_id == chat.id] == []
    assert [a for a in sim.records.archives if a.chat_id == chat.id] == []
    assert not chat.archived
    assert chats_of(sim, live.workflow_id) == [chat]
    assert marker_counts(sim, chat, live.workflow_id, 2) == [1, 1]
    record = await scene.workflow(live.workflow_id)
    assert record is not None
    assert record.state == WorkflowState.FINISHED and record.epoch == 1
    assert record.flow_run_id == str(live.run.id)
    assert list(scene.payments.applied.values()) == [1]


async def turn_results(client: PrefectClient, run_id: uuid.UUID) -> list[Any]:
    """The persisted results of the run's ``run-turn`` task runs, in step order."""
    task_runs = await client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
    )
    turns = sorted(
        (t for t in task_runs if " · step " in t.name),
        key=lambda t: int(t.name.rsplit(" · step ", 1)[1].split()[0]),
    )
    # One task run per step (Prefect's retries of a step stay inside its task run).
    steps = [t.name.rsplit(" · ", 1)[1] for t in turns]
    assert steps == ["step 1 of 3", "step 2 of 3", "step 3 of 3"], turns
    return [await t.state.aresult() for t in turns if t.state is not None]


async def transcript_verdicts(client: PrefectClient, workflow_id: str) -> list[tuple[str, ...]]:
    """(step, verdict) per row of the run's published transcript artifact."""
    key = f"transcript-{workflow_id}"  # the ids here are slugs already
    artifacts = await client.read_artifacts(
        artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
    )
    assert len(artifacts) == 1, artifacts
    markdown = str(artifacts[0].data)
    rows = [
        tuple(cell.strip() for cell in line.strip("|").split("|"))
        for line in markdown.splitlines()
        if line.startswith("| ") and line[2:3].isdigit()
    ]
    return [row[:2] for row in rows]
