"""Runs lost before they began their workflow, found in Prefect and launched again.

A flow run can die before its ``DurableChat`` takes the workflow's first epoch: its
host killed while the worker submitted it, Prefect's server restarting as it started,
the store out of reach at its first read. The store never hears of such a workflow,
so the stranded-workflow path (which starts from the store) cannot find it. Prefect
can: the run ended Crashed (or Failed before its flow began: Prefect's API out of reach
while it resolved its parameters), or sits Pending long after a worker took it, or Running
long after it started (its host died as it started: nothing will ever end it), and it
still has the name Prefect gave it (a run that began its workflow is renamed after it). Each
is launched again once, from its deployment with its parameters; the relaunch carries
a tag naming the run it replaces, so no later pass launches it twice.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterName,
    FlowRunFilter,
    FlowRunFilterExpectedStartTime,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments.flow_runs import arun_deployment
from prefect.states import Cancelled, Crashed

from coder_chat.durable.records import WorkflowRecord, WorkflowState
from prefect_coder._run.logs import run_log
from prefect_coder._run.marks import stopped_after_its_end
from prefect_coder._run.naming import began_a_workflow
from prefect_coder._run.pulse import heard_lately
from prefect_coder._run.runtime import Ledger, Runtime
from prefect_coder._run.task_policy import launch_task
from prefect_coder.blocks import CoderCredentials

#: The tag every relaunch carries, naming the run it replaces.
REPLACES = "prefect-coder:replaces:"

#: The states of a run on its way to beginning its workflow: lost only once it took too long.
_STARTING = (StateType.PENDING, StateType.RUNNING)
#: A run that failed before its flow began, because Prefect's API was out of reach while
#: it resolved its parameters (its saved blocks): nothing of the user's ran; it is lost,
#: not failed. Prefect says so in the failed state's message.
_UNREACHED = re.compile(
    r"^Validation of flow parameters failed with error: "
    r"(ConnectError|ConnectTimeout|ReadTimeout|ReadError|RemoteProtocolError|PoolTimeout)\b"
)


#: What became of the workflow a cancelled run held, in the words of the run's message.
_ENDED_AS = {
    WorkflowState.CANCELLED: "its workflow was ended for the cancel",
    WorkflowState.FINISHED: "its workflow had finished",
    WorkflowState.FAILED: "its workflow had failed",
    WorkflowState.OVER_BUDGET: "its workflow had stopped at its budget",
}


def replaces_tag(flow_run_id: uuid.UUID | str) -> str:
    return f"{REPLACES}{flow_run_id}"


@launch_task(name="relaunch-lost-runs", task_run_name="relaunch lost runs of {deployment}")
async def relaunch_lost_runs(
    deployment: str,
    within_seconds: float,
    silent_for_seconds: float,
    start_within_seconds: float,
    credentials: CoderCredentials | None = None,
    ledger: Ledger | None = None,
) -> int:
    """Launch again the runs of ``deployment`` lost before they began a workflow, of those
    expected to start in the last ``within_seconds``; returns how many were launched.

    A run is lost once it has sat Pending or Running for ``start_within_seconds`` without
    beginning its workflow: until then it may only be slow to start (a loaded worker host
    took 68 s from taking a run to its flow), and a slow run launched again runs twice.
    A cancelled run is ended once silent for ``silent_for_seconds``."""
    rt = Runtime.from_blocks(credentials, ledger)
    workflows = await rt.store.list_workflows(rt.tenant, deployment=deployment)
    held = {w.flow_run_id: w for w in workflows if w.flow_run_id}
    ended = {run: w for run, w in held.items() if w.state != "running"}
    relaunched = 0
    async with get_client() as client:
        await _settle_ended(client, deployment, within_seconds, start_within_seconds, ended)
        await _settle_cancelled(client, deployment, within_seconds, silent_for_seconds, held)
        for run in await _candidates(client, deployment, within_seconds, start_within_seconds):
            if str(run.id) in held or await _replaced(client, run):
                continue
            await _relaunch(client, run)
            relaunched += 1
    return relaunched


async def _candidates(
    client: PrefectClient, deployment: str, within: float, start_within: float
) -> list[FlowRun]:
    """Crashed runs, runs that failed before their flow began because Prefect's API was
    out of reach, and runs Pending or Running for longer than ``start_within``, that never
    began their workflow."""
    now = datetime.now(UTC)
    runs = await client.read_flow_runs(
        deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment])),
        flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(
                type=FlowRunFilterStateType(any_=[StateType.CRASHED, StateType.FAILED, *_STARTING])
            ),
            expected_start_time=FlowRunFilterExpectedStartTime(
                after_=now - timedelta(seconds=within)
            ),
        ),
        limit=200,
    )
    lost = []
    for run in runs:
        if began_a_workflow(run.name) or run.state is None:
            continue
        if run.state.type == StateType.FAILED and not _UNREACHED.match(run.state.message or ""):
            continue  # a failure of its own: it would only fail again
        if run.state.type in _STARTING:
            since = run.state.timestamp
            if since is None or (now - since).total_seconds() < start_within:
                continue
        lost.append(run)
    return lost


async def _settle_ended(
    client: PrefectClient,
    deployment: str,
    within: float,
    running_for: float,
    ended: dict[str, WorkflowRecord],
) -> None:
    """Runs still shown Running long after the workflow they held ended (their process
    stopped between ending it and telling Prefect): marked Crashed, saying so, so that
    nobody takes them for live ones. Nothing is left for them to do."""
    for run in await _in_state_for(client, deployment, within, StateType.RUNNING, running_for):
        workflow = ended.get(str(run.id))
        if workflow is None:
            continue
        marked = stopped_after_its_end(workflow.workflow_id, workflow.state)
        await client.set_flow_run_state(run.id, marked, force=True)
        run_log().info(f"Run {run.name!r}: its process stopped after its workflow ended.")


async def _in_state_for(
    client: PrefectClient, deployment: str, within: float, state: StateType, at_least: float
) -> list[FlowRun]:
    """The runs of ``deployment`` expected to start in the last ``within`` seconds that have
    been in ``state`` for ``at_least`` seconds."""
    now = datetime.now(UTC)
    runs = await client.read_flow_runs(
        deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment])),
        flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[state])),
            expected_start_time=FlowRunFilterExpectedStartTime(
                after_=now - timedelta(seconds=within)
            ),
        ),
        limit=200,
    )
    return [
        run
        for run in runs
        if run.state is not None
        and run.state.timestamp is not None
        and (now - run.state.timestamp).total_seconds() >= at_least
    ]


async def _settle_cancelled(
    client: PrefectClient,
    deployment: str,
    within: float,
    silent_for: float,
    held: dict[str, WorkflowRecord],
) -> None:
    """Runs a person cancelled whose process stopped before the cancel was carried out (its
    host died with it, say): no worker is left to finish it, and they would read Cancelling
    for good. One silent for ``silent_for`` seconds since the cancel is marked Cancelled,
    once the workflow it holds (``held``, by run) is ended: the sweep ends it when it sees
    the cancel, whatever became of the process; until then a later pass settles the run."""
    for run in await _in_state_for(client, deployment, within, StateType.CANCELLING, silent_for):
        workflow = held.get(str(run.id))
        if workflow is not None and workflow.state == WorkflowState.RUNNING:
            continue  # its workflow is not ended yet: the run's end waits for it
        if await heard_lately(client, run.id) is not None:
            continue  # its process is going: it ends the run itself, or its worker does
        what = "it held no workflow" if workflow is None else _ENDED_AS[workflow.state]
        message = (
            "Cancelled by a person. Its process stopped before it could end this run, so the "
            f"orphan sweep did; {what}."
        )
        await client.set_flow_run_state(run.id, Cancelled(message=message), force=True)
        run_log().info(f"Run {run.name!r}: cancelled by a person, its process gone; ended.")


async def _replaced(client: PrefectClient, run: FlowRun) -> bool:
    later = await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[replaces_tag(run.id)])),
        limit=1,
    )
    return bool(later)


async def _relaunch(client: PrefectClient, run: FlowRun) -> None:
    log = run_log()
    assert run.deployment_id is not None
    why = {
        StateType.CRASHED: "it crashed",
        StateType.PENDING: "it never left Pending",
        StateType.RUNNING: "it has been Running without beginning it",
        StateType.FAILED: "Prefect's API was out of reach as it started",
    }.get(run.state_type or StateType.CRASHED, "it was lost")
    if run.state_type in (StateType.PENDING, StateType.RUNNING):
        # Nothing runs it any more: say so, so that it is not taken for a live one.
        message = f"Lost before it began its workflow ({why}); relaunched."
        await client.set_flow_run_state(run.id, Crashed(message=message), force=True)
    new = await arun_deployment(
        run.deployment_id,
        client=client,
        parameters=run.parameters,
        tags=[replaces_tag(run.id)],
        flow_run_name=re.sub(r" \(relaunched\)$", "", run.name) + " (relaunched)",
        timeout=0,
        as_subflow=False,
    )
    log.info(
        f"Run {run.name!r} was lost before it began its workflow ({why}); relaunched as "
        f"{new.name!r} with the same parameters."
    )
