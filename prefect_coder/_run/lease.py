"""A pass of the orphan sweep holds its deployment's sweep by a lease in the store, and may
take a run that went silent for dead."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from typing import Any

from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.responses import OrchestrationResult, SetStateStatus
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run as current_flow_run
from prefect.settings import PREFECT_UI_URL
from prefect.states import Crashed

from coder_chat import CoderError
from coder_chat.durable.records import Fence, WorkflowRecord, WorkflowState
from coder_chat.durable.store import DurableStore, FencedOut
from coder_chat.durable.sweep import (
    take_sweep_lease,
)
from prefect_coder._run.logs import run_log
from prefect_coder._run.marks import stopped_after_its_end
from prefect_coder._run.naming import tagged_workflow
from prefect_coder._run.pulse import heard_lately
from prefect_coder._run.runtime import Ledger, Runtime, with_retries
from prefect_coder.blocks import CoderCredentials


def flow_run_url(flow_run_id: uuid.UUID) -> str:
    """The run's page in the Prefect UI, or its id when no UI address is configured."""
    ui = PREFECT_UI_URL.value()
    return f"{ui}/runs/flow-run/{flow_run_id}" if ui else str(flow_run_id)


@dataclasses.dataclass
class SweepLease:
    """One pass's hold on its deployment's sweep, kept alive while the pass runs."""

    store: DurableStore
    fence: Fence
    beat_every: float

    async def keep(self) -> None:
        """Beat until cancelled; a pass that lost its lease stops beating."""
        while True:
            await asyncio.sleep(self.beat_every)
            try:
                await self.store.heartbeat(self.fence)
            except FencedOut:
                return
            except CoderError:
                continue  # the next beat tries again

    async def end(self) -> None:
        with contextlib.suppress(CoderError):
            await self.store.finish(self.fence, WorkflowState.FINISHED)


async def hold_the_sweep(
    deployment: str,
    fresh_for: float,
    credentials: CoderCredentials | None,
    ledger: Ledger | None,
    wait_for: float = 0.0,
) -> SweepLease | None:
    """The pass's lease on the deployment's sweep, or ``None`` (and a line saying why)
    when another pass that is alive holds it. A lease in the store, not Prefect's
    concurrency slot: a slot held by a run whose host died stays taken for minutes, and
    across a restart of Prefect's server for good; a lease goes stale with its heartbeat.

    With ``wait_for`` (a pass an event started: a crash the pass going may already have
    looked past) the pass waits up to that long for the lease instead, and ends only when
    a pass that began after it first looked holds or held the lease: that one covers it.
    """
    rt = Runtime.from_blocks(credentials, ledger)
    loop = asyncio.get_running_loop()
    give_up = loop.time() + wait_for
    first: WorkflowRecord | None = None
    while True:
        held = await with_retries(
            lambda: take_sweep_lease(
                rt.store, rt.tenant, deployment, current_flow_run.id, fresh_for
            )
        )
        if not isinstance(held, WorkflowRecord):
            return SweepLease(rt.store, held, fresh_for / 3)
        if first is None:
            first = held
        elif held.epoch > first.epoch:
            run_log().info(
                f"A pass of the sweep of {deployment} that began after this one was asked for "
                f"(run {held.flow_run_id}) covers it; this pass does nothing."
            )
            return None
        if loop.time() >= give_up:
            run_log().info(
                f"Another pass of the sweep of {deployment} is going (run {held.flow_run_id}, "
                f"its heartbeat at {held.heartbeat_at}); this pass does nothing."
            )
            return None
        if held is first and wait_for > 0:
            run_log().info(
                f"Another pass of the sweep of {deployment} is going (run {held.flow_run_id}); "
                "this pass waits for it to end, then goes."
            )
        await asyncio.sleep(_LEASE_POLL_SECONDS)


#: How often a pass waiting for another to end looks at the lease again.
_LEASE_POLL_SECONDS = 1.0


async def _heard_lately(client: PrefectClient, run_id: uuid.UUID) -> str | None:
    try:
        return await heard_lately(client, run_id)
    except Exception as exc:  # noqa: BLE001 - unknown: the trigger's word stands
        run_log().info(f"Could not read what Prefect heard from run {run_id} ({exc}).")
        return None


async def take_silent_run_for_dead(
    flow_run: str, deployment: str, because: str, rt: Runtime
) -> bool:
    """Mark Crashed a run of ``deployment`` that Prefect heard no heartbeat from (the
    deployment's silent trigger names it, ``prefect.flow-run.<id>`` or its id), so that the
    pass relaunches its workflow as it does any crashed run's. Only a run still Running is
    marked: one that ended, paused or was cancelled meanwhile has said what became of it.
    A run whose workflow the store says ended (its process died before it told Prefect) is
    marked so, not as one whose workflow is to be relaunched. Returns whether it was marked."""
    log = run_log()
    try:
        run_id = uuid.UUID(flow_run.removeprefix("prefect.flow-run."))
    except ValueError:
        log.warning(f"{flow_run!r} names no flow run; no run is taken for dead.")
        return False
    async with get_client() as client:
        try:
            run = await client.read_flow_run(run_id)
            target = await client.read_deployment(run.deployment_id) if run.deployment_id else None
        except ObjectNotFound:
            log.info(f"Run {run_id} is gone; nothing to take for dead.")
            return False
        if target is None or target.name != deployment:
            log.info(f"Run {run.name!r} is not a run of {deployment}; left to its own sweep.")
            return False
        if run.state is None or run.state.type != StateType.RUNNING:
            state = run.state.name if run.state else "no state"
            log.info(f"Run {run.name!r} went silent but is {state} now; nothing to take for dead.")
            return False
        if (heard := await _heard_lately(client, run_id)) is not None:
            log.info(f"Run {run.name!r} went silent but spoke since ({heard}): it is alive.")
            return False
        ended = await _ended_workflow(rt, run)
        marked = (
            stopped_after_its_end(ended.workflow_id, ended.state)
            if ended is not None
            else Crashed(
                message=(
                    f"Its process went silent ({because}): its host or its worker is gone. "
                    "Marked Crashed by the orphan sweep, which relaunches its workflow."
                )
            )
        )
        result: OrchestrationResult[Any] = await client.set_flow_run_state(run_id, marked)
    if result.status != SetStateStatus.ACCEPT:
        log.info(f"Run {run.name!r} was not marked Crashed ({result.status.value}).")
        return False
    after = f"; its workflow had {ended.state}" if ended is not None else ""
    log.info(f"Run {run.name!r} went silent ({because}){after}; marked Crashed.")
    return True


async def _ended_workflow(rt: Runtime, run: FlowRun) -> WorkflowRecord | None:
    """The workflow ``run`` held, if the store says it ended while that run held it."""
    workflow_id = tagged_workflow(run.tags)
    if workflow_id is None:
        return None
    try:
        workflow = await with_retries(lambda: rt.store.get_workflow(rt.tenant, workflow_id))
    except CoderError as exc:  # out of reach: the pass relaunches nothing the store says ended
        run_log().info(f"Could not read workflow {workflow_id} from the store ({exc}).")
        return None
    if workflow is None or workflow.flow_run_id != str(run.id):
        return None
    return workflow if workflow.state != WorkflowState.RUNNING else None
