"""``sweep_orphans`` and ``relaunch_workflow``: the orphan sweep's durable units."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from prefect.artifacts import acreate_table_artifact
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments.flow_runs import arun_deployment
from prefect.exceptions import ObjectNotFound
from pydantic import BaseModel

from coder_chat.durable.records import Fence, WorkflowRecord, WorkflowState
from coder_chat.durable.retire import Retired
from coder_chat.durable.store import DurableStore
from coder_chat.durable.sweep import (
    SWEEP_WORKFLOW,
    ChatFinding,
    SweepPolicy,
    end_cancelled,
    mark_failed,
    sweep,
)
from prefect_coder._run.lease import flow_run_url
from prefect_coder._run.logs import run_log
from prefect_coder._run.marks import SUPERSEDED, note_on_run
from prefect_coder._run.naming import REFUSED, run_name, slug
from prefect_coder._run.runtime import Ledger, Runtime
from prefect_coder._run.task_policy import durable_task, launch_task
from prefect_coder.blocks import CoderCredentials
from prefect_coder.imports import resolve_tools
from prefect_coder.tasks.lost_runs import replaces_tag

#: A run that ended like this left its workflow unfinished: relaunch it.
ENDED_BADLY = frozenset({"crashed", "superseded", "gone"})
#: A run a person cancelled (the worker then kills its process): its workflow ends.
CANCELLED_BY_A_PERSON = frozenset(
    {StateType.CANCELLING.value.lower(), StateType.CANCELLED.value.lower()}
)
#: A run like this is waiting to go on by itself: paused or suspended between turns (its
#: process may have exited; resuming it runs the flow again), or scheduled to start.
WAITING = frozenset({StateType.PAUSED.value.lower(), StateType.SCHEDULED.value.lower()})
#: A run that ended like this ended its workflow: never relaunch it.
ENDED_FOR_GOOD = frozenset({StateType.FAILED.value.lower(), StateType.COMPLETED.value.lower()})


class SweepSummary(BaseModel):
    chats_seen: int
    findings: list[dict[str, Any]]
    stranded: list[WorkflowRecord]
    #: The workflows a person cancelled, ended by this pass.
    cancelled: list[str] = []


@durable_task(name="sweep-orphans", task_run_name="sweep {policy.deployment}")
async def sweep_orphans(
    policy: SweepPolicy,
    tools: Sequence[str] = (),
    credentials: CoderCredentials | None = None,
    ledger: Ledger | None = None,
    lease: Fence | None = None,
) -> SweepSummary:
    """List every chat of the policy's deployment, retire orphans, interrupt stuck turns,
    find stranded workflows."""
    log = run_log()
    deployment, dry_run = policy.deployment, policy.dry_run
    step_tools = resolve_tools(tools)
    rt = Runtime.from_blocks(credentials, ledger)
    report = await sweep(rt.client, rt.store, rt.tenant, policy, step_tools, log.info, lease)
    running = await rt.store.list_workflows(
        rt.tenant, deployment=deployment, states=[WorkflowState.RUNNING]
    )
    stranded, cancelled = await _stranded(rt.store, report.stranded, running, log.info)
    if not dry_run:
        for workflow in cancelled:
            wid = workflow.workflow_id
            mine = [f for f in report.findings if f.workflow_id == wid]
            log.info(f"Workflow {wid}: its run was cancelled by a person, so the workflow ends.")
            retired = await end_cancelled(
                rt.client,
                rt.store,
                workflow,
                [f.chat_id for f in mine],
                step_tools,
                policy.options,
                log.info,
            )
            await _say_cancelled(workflow, retired, log.info)
            _retold(mine, retired, wid)
    findings = [vars(f) for f in report.findings]
    await _publish(deployment, report.chats_seen, findings, list(stranded.values()), cancelled)
    ended = f", {len(cancelled)} cancelled by a person" if cancelled else ""
    log.info(
        f"Sweep of {deployment}: {report.chats_seen} chat(s) seen, {len(report.acted())} "
        f"acted on, {len(stranded)} stranded workflow(s){ended}."
    )
    return SweepSummary(
        chats_seen=report.chats_seen,
        findings=findings,
        stranded=list(stranded.values()),
        cancelled=[w.workflow_id for w in cancelled],
    )


async def _say_cancelled(
    workflow: WorkflowRecord, retired: list[Retired], report: Callable[[str], None]
) -> None:
    """Say what ending a cancelled workflow did, here and on the run a person cancelled."""
    wid = workflow.workflow_id
    archived = [r.chat_id for r in retired if r.done]
    left = [r.chat_id for r in retired if not r.done]
    chats = (f"its chat {', '.join(archived)} is archived" if archived else "it had no chat") + (
        f"; chat {', '.join(left)} is left for the next sweep to archive" if left else ""
    )
    said = (
        f"Workflow {wid} is cancelled: its turn was stopped and {chats}. Nothing relaunches "
        f"it; `prefect-coder workflows resume {wid}` carries it on from its last finished step."
    )
    report(said)
    if workflow.flow_run_id:
        await note_on_run(workflow.flow_run_id, said, report)


def _retold(findings: list[ChatFinding], retired: list[Retired], workflow_id: str) -> None:
    """The pass's findings of a cancelled workflow's chats, as they ended: first listed
    as kept (its workflow was running then), then archived with it."""
    ended = {r.chat_id: r for r in retired}
    for finding in findings:
        if (chat := ended.get(finding.chat_id)) is not None:
            finding.action = chat.action
            finding.reason = f"workflow {workflow_id} was cancelled by a person"


async def _publish(
    deployment: str,
    chats_seen: int,
    findings: list[dict[str, Any]],
    stranded: list[WorkflowRecord],
    cancelled: list[WorkflowRecord],
) -> None:
    """The sweep's table artifact, every pass: what it did, or that there was nothing to do."""
    rows = [{k: str(v) for k, v in f.items()} for f in findings if f["action"] != "kept"]
    rows += [_workflow_row(w, "relaunch", "stranded") for w in stranded]
    rows += [_workflow_row(w, "end", "cancelled by a person") for w in cancelled]
    if not rows:
        rows = [
            {
                "chat_id": "",
                "status": "",
                "workflow_id": "",
                "action": "nothing to do",
                "reason": f"{chats_seen} chat(s) seen, none orphaned or stuck",
            }
        ]
    await acreate_table_artifact(
        rows,
        key=f"orphan-sweep-{slug(deployment)}",
        description=f"Orphan sweep of {deployment}: {chats_seen} chat(s) seen",
    )


def _workflow_row(workflow: WorkflowRecord, action: str, reason: str) -> dict[str, str]:
    return {
        "chat_id": workflow.chat_id or "",
        "status": "(workflow)",
        "workflow_id": workflow.workflow_id,
        "action": action,
        "reason": reason,
    }


async def _stranded(
    store: DurableStore,
    silent: list[WorkflowRecord],
    running: list[WorkflowRecord],
    report: Callable[[str], None],
) -> tuple[dict[str, WorkflowRecord], list[WorkflowRecord]]:
    """Which running workflows to relaunch, and which a person cancelled.

    Relaunched: silent ones, and those whose run crashed, is gone, or was superseded
    without a successor. Cancelled: those whose run a person cancelled (UI, CLI, API),
    or whose relaunch a person cancelled before it began: told from a crash by the
    run's state in Prefect, never by code in the killed process. A run that ended
    Failed (or Completed) is never relaunched: it would only fail again. When its own
    failure hook could not mark it FAILED, the sweep does, once the run has been silent
    too."""
    stale = {w.workflow_id for w in silent}
    stranded: dict[str, WorkflowRecord] = {}
    cancelled: list[WorkflowRecord] = []
    for workflow in running:
        if workflow.workflow_id.startswith(SWEEP_WORKFLOW):
            continue
        state = await _flow_run_state(workflow.flow_run_id)
        if state in WAITING:
            continue  # its heartbeat stops while it waits; it is not stranded
        if state in CANCELLED_BY_A_PERSON:
            cancelled.append(workflow)
            continue
        if state in ENDED_FOR_GOOD:
            if workflow.workflow_id in stale:
                await mark_failed(store, workflow)
                report(
                    f"Workflow {workflow.workflow_id}: its last run ended {state}; marked "
                    "failed, not relaunched."
                )
            continue
        if state in ENDED_BADLY or workflow.workflow_id in stale:
            if await _relaunch_cancelled(workflow):
                cancelled.append(workflow)
                continue
            why = f"its flow run is {state}" if state in ENDED_BADLY else "its heartbeat stopped"
            report(f"Workflow {workflow.workflow_id} is stranded: {why}.")
            stranded[workflow.workflow_id] = workflow
    return stranded, cancelled


async def _flow_run_state(flow_run_id: str | None) -> str | None:
    """The state of the workflow's last flow run (lower case; ``superseded`` for a run
    we cancelled because another took its workflow over), ``gone``, or ``None``."""
    if not flow_run_id:
        return None
    async with get_client() as client:
        try:
            flow_run = await client.read_flow_run(uuid.UUID(flow_run_id))
        except ObjectNotFound:
            return "gone"
    state = flow_run.state
    if state is None:
        return None
    if state.type == StateType.CANCELLED and state.name == SUPERSEDED:
        return "superseded"
    return state.type.value.lower()


async def _relaunch_cancelled(workflow: WorkflowRecord) -> bool:
    """Whether a person cancelled the relaunch of the workflow's last run before that
    relaunch began it (the store still names the run it replaces)."""
    if not workflow.flow_run_id:
        return False
    async with get_client() as client:
        relaunches = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[replaces_tag(workflow.flow_run_id)])
            ),
            limit=10,
        )
    return any(
        r.state is not None and r.state.type == StateType.CANCELLED and r.state.name != SUPERSEDED
        for r in relaunches
    )


@launch_task(name="relaunch-workflow", task_run_name="relaunch {workflow.workflow_id}")
async def relaunch_workflow(
    workflow: WorkflowRecord, max_relaunches: int = 3, relaunch_start: float = 300.0
) -> str | None:
    """Launch the workflow's deployment again, same workflow id and parameters.

    Bounded: at most ``max_relaunches`` times per workflow. The new run takes a
    newer fencing epoch, so the old one cannot act even if it wakes up. An earlier
    relaunch still unfinished is waited for, unless it was made more than
    ``relaunch_start`` seconds ago: it has not begun the workflow by then (the store
    still names the stranded run), so it is taken for lost and another is made.
    Returns the new flow run id, or ``None`` when nothing was launched.
    """
    log = run_log()
    tag = f"prefect-coder:relaunch:{workflow.workflow_id}"[:200]
    async with get_client() as client:
        last = await _last_run(client, workflow)
        if last is None or last.deployment_id is None:
            return None
        earlier = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag]))
        )
        if await _held_back(client, workflow, last, earlier, max_relaunches, relaunch_start):
            return None
        new = await arun_deployment(
            last.deployment_id,
            client=client,
            parameters=last.parameters,
            tags=[tag, replaces_tag(last.id)],
            flow_run_name=_next_name(last.name, workflow),
            timeout=0,
            as_subflow=False,
        )
    log.info(
        f"Relaunched workflow {workflow.workflow_id} as flow run {new.name!r} "
        f"({flow_run_url(new.id)}); it takes over from run {last.name!r}."
    )
    return str(new.id)


async def _last_run(client: PrefectClient, workflow: WorkflowRecord) -> FlowRun | None:
    """The workflow's last flow run, if it can be launched again (from its deployment)."""
    log = run_log()
    if not workflow.flow_run_id:
        log.warning(f"workflow {workflow.workflow_id} has no flow run to relaunch from")
        return None
    try:
        last = await client.read_flow_run(uuid.UUID(workflow.flow_run_id))
    except ObjectNotFound:
        log.warning(f"workflow {workflow.workflow_id}: its flow run is gone; relaunch it by hand")
        return None
    if last.deployment_id is None:
        log.warning(
            f"workflow {workflow.workflow_id} ran outside a deployment; relaunch it by hand"
        )
        return None
    return last


async def _held_back(
    client: PrefectClient,
    workflow: WorkflowRecord,
    last: FlowRun,
    earlier: list[FlowRun],
    max_relaunches: int,
    relaunch_start: float,
) -> bool:
    """Whether no relaunch is made now (and why, in the log): an earlier one is on its
    way, one was refused for its code that is deployed still, or the limit is reached."""
    log = run_log()
    unfinished = [r for r in earlier if r.state is None or not r.state.is_final()]
    pending = [r for r in unfinished if _age(r) <= relaunch_start]
    for lost in (r for r in unfinished if r not in pending):
        log.info(
            f"Workflow {workflow.workflow_id}: its relaunch {lost.name!r} has not begun it "
            f"{_age(lost):.0f} s after it was made; relaunched again."
        )
    if pending:
        # Its relaunch has not begun the workflow yet (waiting for a worker, starting):
        # another would only race it.
        log.info(
            f"Workflow {workflow.workflow_id}: its relaunch {pending[0].name!r} is on its "
            "way; not relaunched again."
        )
        return True
    refused = [r for r in earlier if REFUSED in r.tags and replaces_tag(last.id) in r.tags]
    assert last.deployment_id is not None
    if refused and not await _deployed_since(client, last.deployment_id, refused):
        log.warning(_refused_line(workflow.workflow_id, refused))
        return True
    # A relaunch refused for its code is no sign of a workflow that cannot run: only the
    # others count towards the limit.
    counted = [r for r in earlier if REFUSED not in r.tags]
    if len(counted) >= max_relaunches:
        log.warning(
            f"workflow {workflow.workflow_id} was relaunched {len(counted)} times already; giving up"
        )
        return True
    return False


async def _deployed_since(
    client: PrefectClient, deployment_id: uuid.UUID, refused: list[FlowRun]
) -> bool:
    """Whether the deployment was deployed again after its last refused relaunch was made
    (new code, maybe with the change behind ``chat.patched``): then it is worth another."""
    deployment = await client.read_deployment(deployment_id)
    made = max(r.created or datetime.now(UTC) for r in refused)
    return deployment.updated is not None and deployment.updated > made


def _refused_line(workflow_id: str, refused: list[FlowRun]) -> str:
    latest = max(refused, key=lambda r: r.created or datetime.now(UTC))
    return (
        f"Workflow {workflow_id}: its relaunch {latest.name!r} was refused, its code asking "
        "another prompt of a step the workflow had already sent (PromptChanged). It is left "
        "as it was, and not relaunched on this code again: deploy the change behind "
        "chat.patched(...), or the code it ran, and the next pass relaunches it; or run "
        f"`prefect-coder workflows resume {workflow_id}`."
    )


def _age(run: FlowRun) -> float:
    """Seconds since the flow run was made."""
    made = run.created or datetime.now(UTC)
    return (datetime.now(UTC) - made).total_seconds()


def _next_name(last_name: str, workflow: WorkflowRecord) -> str:
    """A run of one workflow is named by its epoch; a run of many keeps its name."""
    if last_name == run_name(workflow.workflow_id, workflow.epoch):
        return run_name(workflow.workflow_id, workflow.epoch + 1)
    return last_name.removesuffix(" (relaunched)") + " (relaunched)"
