"""Playing a person's action on a workflow of the fleet (:class:`~.plan.Person`).

A person acts through the same doors a team's people use, never through the lab's
back ones: Prefect's API as the UI's Cancel button and its run form call it, and
``prefect_coder.operations.resume_workflow``, which ``prefect-coder workflows
resume`` calls. What they did and saw is recorded here, with the moments the
checks (:mod:`.check_people`) judge the store's and Coder's records against.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar
from uuid import UUID

import httpx
from prefect.client.orchestration import get_client
from prefect.client.schemas import OrchestrationResult
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.states import Cancelled, Cancelling

from coder_chat import CoderConfigError
from coder_chat.durable.records import WorkflowState
from coder_chat.durable.store import DurableStore
from prefect_coder.operations import resume_workflow

from .config import DURABLE_CHAT
from .faults import reach
from .fleet import Fleet
from .observe import Observer
from .plan import FleetWorkflow, Person
from .runs import ended, parameters
from .truth import read_truth

T = TypeVar("T")

POLL = 0.5
#: How long a person tries Prefect's API again while its server is away.
API_PATIENCE = 90.0
#: How long a person waits for the run they cancel to be shown running (a relaunch
#: starting, say) before they give up on cancelling it.
RUNNING_WAIT = 60.0
#: How long the cancel may take to end the workflow in the store: the sweep the cancel
#: triggers waits up to 150 s for a pass under way, then starts cold on two cores.
CANCEL_LIMIT = 240.0
#: Seconds the person takes between seeing the workflow cancelled and resuming it.
THINK = 5.0
#: How long the resumed run may take to end the workflow again.
RESUME_LIMIT = 300.0
#: How long the changed-prompt run may take to be refused (it may wait for a host a
#: fault took down); past it the lab cancels the run, which never began.
REFUSAL_LIMIT = 240.0


@dataclass
class PersonRecord:
    workflow_id: str
    person: Person
    #: Whether the action was taken (a cancel needs a running run; neither acts on a
    #: workflow that has ended).
    done: bool = False
    outcome: str = "its moment never came"
    acted_at: datetime | None = None
    #: The run cancelled, or the changed-prompt run.
    run_id: str = ""
    #: When the lab saw the store say ``cancelled``.
    cancelled_seen: datetime | None = None
    #: The chats of the workflow Coder held unarchived then, with their status.
    live_at_cancel: list[str] = field(default_factory=list)
    resumed_run: str = ""
    #: The cancel came as the workflow was finishing: the store said ``finished``, and the
    #: cancelled run is the workflow's end (its process stopped by the cancel after it).
    finished_first: bool = False
    #: What went wrong with the person's action itself (a violation).
    failure: str = ""

    def describe(self) -> str:
        return f"{self.workflow_id}: {self.person.describe()}: {self.outcome}"


async def act(
    fleet: Fleet, observer: Observer, workflow: FleetWorkflow, started: float, record: PersonRecord
) -> None:
    """Wait for the person's moment, then take their action, writing ``record``."""
    person = record.person
    await reach(observer, person.at, started, limit=None)
    record.outcome = "begun"
    if person.kind == "changed-prompt":
        # Refused all the same once the workflow has ended: its first step is stored.
        await change_prompt(fleet, workflow, record)
    elif observer.ended(workflow.workflow_id):
        record.outcome = "not tried (the workflow had ended)"
    else:
        await cancel_then_resume(fleet, observer, record)


async def cancel_then_resume(fleet: Fleet, observer: Observer, record: PersonRecord) -> None:
    run = await _running_holder(observer, record.workflow_id)
    if run is None:
        record.outcome = f"not tried (no run of it was shown running for {RUNNING_WAIT:.0f}s)"
        return

    async def cancel() -> OrchestrationResult[Any]:
        async with get_client() as client:
            # As the UI's Cancel button: the run is set Cancelling, not forced.
            return await client.set_flow_run_state(run.id, Cancelling())

    answer = await _patiently(cancel)
    if answer.state is None or answer.state.type != StateType.CANCELLING:
        record.outcome = f"not tried (Prefect refused the cancel: {answer.status.value})"
        return
    record.done, record.run_id = True, str(run.id)
    record.acted_at = datetime.now(UTC)
    state = await _until_not_running(observer, record.workflow_id, CANCEL_LIMIT)
    if state == WorkflowState.FINISHED:
        record.outcome = f"run {run.name} cancelled, but the workflow finished first"
        record.finished_first = True
        return
    if state != WorkflowState.CANCELLED:
        record.failure = f"the store said {state} {CANCEL_LIMIT:.0f}s after the cancel"
        record.outcome = f"run {run.name} cancelled; the store said {state}"
        return
    record.cancelled_seen = datetime.now(UTC)
    record.live_at_cancel = await _live_chats(fleet, record.workflow_id)
    cancelled_epoch = observer.epoch(record.workflow_id)
    await asyncio.sleep(THINK)
    await _resume(observer.store, observer.tenant, record, run.name)
    if record.resumed_run:
        # The person's work is done once the resumed run has ended the workflow again.
        await _until_ended_again(observer, record, cancelled_epoch)


async def _until_ended_again(observer: Observer, record: PersonRecord, epoch: int) -> None:
    wf, give_up = record.workflow_id, time.monotonic() + RESUME_LIMIT
    while time.monotonic() < give_up:
        if observer.epoch(wf) > epoch and observer.ended(wf):
            state = observer.progress[wf].record
            record.outcome += f", then ended {state.state if state else '?'}"
            return
        await asyncio.sleep(POLL)
    record.outcome += f", and had not ended again {RESUME_LIMIT:.0f}s later"


async def _running_holder(observer: Observer, workflow_id: str) -> FlowRun | None:
    """The run holding the workflow, once Prefect shows it running (as a person sees it)."""
    give_up = time.monotonic() + RUNNING_WAIT
    while time.monotonic() < give_up and not observer.ended(workflow_id):
        holder = observer.holder(workflow_id)
        if holder:
            with contextlib.suppress(httpx.TransportError):
                async with get_client() as client:
                    run = await client.read_flow_run(UUID(holder))
                if run.state_type == StateType.RUNNING:
                    return run
        await asyncio.sleep(POLL)
    return None


async def _until_not_running(
    observer: Observer, workflow_id: str, limit: float
) -> WorkflowState | None:
    give_up = time.monotonic() + limit
    while time.monotonic() < give_up:
        record = observer.progress[workflow_id].record if workflow_id in observer.progress else None
        if record is not None and record.state != WorkflowState.RUNNING:
            return record.state
        await asyncio.sleep(POLL)
    return WorkflowState.RUNNING


async def _live_chats(fleet: Fleet, workflow_id: str) -> list[str]:
    coder = fleet.coder
    assert coder is not None
    truth = await read_truth(coder.url, coder.token)
    return [f"{c.id} [{c.status}]" for c in truth.workflow_chats(workflow_id) if not c.archived]


async def _resume(store: DurableStore, tenant: str, record: PersonRecord, cancelled: str) -> None:
    """As ``prefect-coder workflows resume ID`` does, tried again while Prefect's API is
    away (a fault may be restarting its server)."""
    for _ in range(10):
        try:
            resumed = await resume_workflow(store, tenant, record.workflow_id)
        except CoderConfigError as exc:
            record.failure = f"the resume was refused: {exc}"
            record.outcome = f"run {cancelled} cancelled; {record.failure}"
            return
        except httpx.ConnectError:  # the server is away: nothing was launched
            await asyncio.sleep(3.0)
            continue
        record.resumed_run = str(resumed.id)
        record.outcome = f"run {cancelled} cancelled, the workflow stored cancelled; resumed"
        return
    record.failure = "the resume could not reach Prefect's API"
    record.outcome = f"run {cancelled} cancelled; {record.failure}"


async def change_prompt(fleet: Fleet, workflow: FleetWorkflow, record: PersonRecord) -> None:
    """Run the workflow again from its deployment's form, its first prompt reworded."""
    person = record.person
    params = {**parameters(workflow, fleet.timings), "prompts": workflow.changed_prompts}

    async def launch() -> FlowRun:
        async with get_client() as client:
            deployment = await client.read_deployment_by_name(DURABLE_CHAT)
            return await client.create_flow_run_from_deployment(
                deployment.id, parameters=params, work_queue_name=person.queue
            )

    run = await _patiently(launch)
    record.done, record.run_id = True, str(run.id)
    record.acted_at = datetime.now(UTC)
    final = await _until_ended(run.id, REFUSAL_LIMIT)
    if final is None:
        await _give_up(run.id)
        record.outcome = f"run {run.name} never ran in {REFUSAL_LIMIT:.0f}s: cancelled by the lab"
        return
    state = final.state
    said = f"{state.type.value}/{state.name}: {(state.message or '')[:120]}" if state else "-"
    record.outcome = f"run {run.name} ended {said}"


async def _patiently(call: Callable[[], Awaitable[T]]) -> T:
    """``call``, again while Prefect's server is down (a fault restarting it): only a
    connection refused is tried again, so nothing the server took is asked twice."""
    give_up = time.monotonic() + API_PATIENCE
    while True:
        try:
            return await call()
        except httpx.ConnectError:
            if time.monotonic() > give_up:
                raise
            await asyncio.sleep(1.0)


async def _until_ended(run_id: UUID, limit: float) -> FlowRun | None:
    give_up = time.monotonic() + limit
    while time.monotonic() < give_up:
        with contextlib.suppress(httpx.TransportError):
            async with get_client() as client:
                run = await client.read_flow_run(run_id)
            if ended(run):
                return run
        await asyncio.sleep(POLL)
    return None


async def _give_up(run_id: UUID) -> None:
    with contextlib.suppress(httpx.TransportError):
        async with get_client() as client:
            run = await client.read_flow_run(run_id)
            if run.state_type in (StateType.SCHEDULED, StateType.PENDING):
                message = "fleet lab: the person's run never began"
                await client.set_flow_run_state(run_id, Cancelled(message=message), force=True)
