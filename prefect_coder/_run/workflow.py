"""A workflow as one flow run holds it: :class:`WorkflowRun`, begun, kept alive and ended.

One object carries a workflow from the flow down to the store: who it is and the
epoch that fences this run, the blocks and the process's shared client and store
they resolve to, its settings and tools, and how its chat is made. Every task takes
it whole, so nothing is taken apart and rebuilt on the way down.

Beginning a run takes the workflow's next fencing epoch; from then on only this run
may act for it. A workflow the store holds as finished is not begun again: a re-run
replays its finished steps from the store and writes nothing, unless it goes on past
them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from coder_chat import CoderError
from coder_chat.durable.context import DurableOptions, StepContext, StepTools
from coder_chat.durable.fence import FenceGuard
from coder_chat.durable.markers import step_number
from coder_chat.durable.records import (
    AfterSteps,
    Fence,
    StepRecord,
    WorkflowRecord,
    WorkflowState,
    prompt_digest,
)
from coder_chat.durable.step import StepResult
from coder_chat.durable.store import FencedOut
from coder_chat.protocol.usage import UsageTotals
from prefect_coder._run.runtime import Ledger, Runtime, with_retries
from prefect_coder.blocks import CoderCredentials
from prefect_coder.settings import WorkflowSettings

T = TypeVar("T")


@dataclass(frozen=True)
class Workflow:
    """A workflow as a flow describes it: who it is, where it runs, how its turns run."""

    workflow_id: str
    deployment: str
    flow_run_id: str | None
    credentials: CoderCredentials | None
    ledger: Ledger | None
    settings: WorkflowSettings
    tools: StepTools
    #: How many turns the flow means to take, when it knows (for names and progress).
    expected_turns: int | None = None
    #: Whether the flow run holds other workflows too (then every line names this one).
    shares_run: bool = False

    def options(self) -> DurableOptions:
        """What its steps run with (its chat's options among them), built once per run."""
        return self.settings.options(self.deployment)

    async def retried(self, what: Callable[[], Awaitable[T]]) -> T:
        """``what`` (store or Coder work outside a task: begin, end, inputs) tried again
        on transient failures, as the workflow's task settings say."""
        return await with_retries(what, self.settings.tasks.delays())


class WorkflowRun:
    """One workflow, as the flow run that holds its epoch acts for it: the one object every
    task takes (a plain class, so that Prefect never walks or hashes it as a parameter)."""

    __slots__ = ("guard", "options", "runtime", "workflow")

    def __init__(self, workflow: Workflow, fence: Fence, rt: Runtime) -> None:
        self.workflow = workflow
        self.runtime = rt
        self.options = workflow.options()
        self.guard = FenceGuard(rt.store, fence)

    @property
    def fence(self) -> Fence:
        """The epoch this run holds: its guard's, the one place it is kept."""
        return self.guard.fence

    @fence.setter
    def fence(self, fence: Fence) -> None:
        self.guard.fence = fence

    def __repr__(self) -> str:
        return f"WorkflowRun({self.workflow_id!r}, epoch={self.fence.epoch})"

    @property
    def workflow_id(self) -> str:
        return self.fence.workflow_id

    async def retried(self, what: Callable[[], Awaitable[T]]) -> T:
        """:meth:`Workflow.retried`, for this workflow."""
        return await self.workflow.retried(what)

    @property
    def of_turns(self) -> str:
        """`` of 3`` when the flow said how many turns it takes, else nothing."""
        turns = self.workflow.expected_turns
        return f" of {turns}" if turns else ""

    def step_title(self, step: int) -> str:
        """``Step 2 of 3``; in a flow run of many workflows, ``trip-7, step 2 of 3``."""
        if self.workflow.shares_run:
            return f"{self.workflow_id}, step {step}{self.of_turns}"
        return f"Step {step}{self.of_turns}"

    def step_context(
        self,
        step: int,
        report: Callable[[str], None],
        *,
        first_try: bool = False,
        tell: Callable[[str], None] | None = None,
    ) -> StepContext:
        return StepContext(
            self.runtime.client,
            self.guard,
            self.workflow_id,
            step,
            self.workflow.tools,
            self.options,
            report,
            first_try=first_try,
            title=self.step_title(step),
            tell=tell,
        )


@dataclass
class Began:
    """What beginning a run found and took."""

    run: WorkflowRun
    #: Nothing was taken yet: the workflow ran before, and this run replays its finished
    #: steps from the store, writing nothing, until it goes on past them (then it takes
    #: the workflow's next epoch). A run refused on the way (a changed prompt) leaves the
    #: workflow exactly as it was.
    replay: bool
    #: The workflow's finished steps, by number (read once, when it ran before).
    stored: dict[int, StepRecord] = field(default_factory=dict)
    #: The flow run that held the workflow before, while it was running.
    previous_run: str | None = None
    #: The workflow as the store held it before this run.
    before: WorkflowRecord | None = None
    #: The last step an earlier run sent (finished or not): a patch met before it was
    #: passed without the patch.
    last_sent_step: int = 0

    @property
    def finished_before(self) -> bool:
        """The workflow had finished in an earlier run."""
        return self.before is not None and self.before.state == WorkflowState.FINISHED


async def begin_workflow(workflow: Workflow) -> Began:
    """Take the first epoch of a new workflow; replay one that ran before from the store,
    taking nothing until the run goes on past what its earlier runs did."""
    rt = Runtime.from_blocks(workflow.credentials, workflow.ledger)
    wid = workflow.workflow_id
    before = await workflow.retried(lambda: rt.store.get_workflow(rt.tenant, wid))
    stored = await _stored(rt, workflow) if before is not None else {}
    previous = before.flow_run_id if before and before.state == WorkflowState.RUNNING else None
    if before is not None:
        fence = Fence(tenant=rt.tenant, workflow_id=wid, epoch=before.epoch)
        run = WorkflowRun(workflow, fence, rt)
        sent = max(stored, default=0)
        if before.state != WorkflowState.FINISHED:
            sent = max(sent, await _step_in_flight(rt, workflow, before))
        return Began(run, True, stored, previous, before, sent)
    run = WorkflowRun(workflow, await take_epoch(rt, workflow), rt)
    return Began(run, False, stored, previous, before)


async def _step_in_flight(rt: Runtime, workflow: Workflow, before: WorkflowRecord) -> int:
    """The step an earlier run was sending on the workflow's chat when it stopped (its
    journal's), or 0."""
    if before.chat_id is None:
        return 0
    chat_id = before.chat_id
    record = await workflow.retried(lambda: rt.store.get_chat(rt.tenant, chat_id))
    marker = record.journal.marker if record and record.journal else ""
    return step_number(marker)


async def take_epoch(rt: Runtime, workflow: Workflow) -> Fence:
    """The workflow's next epoch: from now on only this run may act for it."""
    return await workflow.retried(
        lambda: rt.store.begin_run(
            rt.tenant,
            workflow.workflow_id,
            deployment=workflow.deployment,
            flow_run_id=workflow.flow_run_id,
            archive_at_end=workflow.settings.archive_at_end,
        )
    )


async def _stored(rt: Runtime, workflow: Workflow) -> dict[int, StepRecord]:
    wid = workflow.workflow_id
    steps = await workflow.retried(lambda: rt.store.list_steps(rt.tenant, wid))
    return {s.step: s for s in steps}


async def finish_workflow(
    run: WorkflowRun, state: WorkflowState, after_steps: AfterSteps | None = None
) -> None:
    await run.retried(lambda: run.runtime.store.finish(run.fence, state, after_steps))


async def heartbeat_forever(run: WorkflowRun, report: Callable[[str], None]) -> None:
    """Beat every ``heartbeat_seconds`` until cancelled; only a superseded run stops beating.

    The sweep trusts this heartbeat, not Prefect's zombie detection, which is
    minutes late and never sees a killed worker. So a failed beat (the store
    restarting, say) is reported and tried again at the next one: stopping would
    make a healthy run look stranded and get it relaunched.
    """
    while True:
        await asyncio.sleep(run.workflow.settings.heartbeat_seconds)
        try:
            await run.runtime.store.heartbeat(run.fence)
            run.guard.confirm()
        except FencedOut:
            report(f"A newer run took workflow {run.workflow_id}; this run stops beating.")
            return
        except CoderError as exc:
            report(f"Heartbeat of workflow {run.workflow_id} failed ({exc}); trying again.")


async def record_cached_step(run: WorkflowRun, prompt: str, result: StepResult) -> None:
    """A step Prefect's result cache answered, written to the store when it lacks it (a
    ledger lost or replaced while the results were kept): its record and checkpoint, so
    that the next step goes on in the same chat, and the sweep and the archive know it."""
    store, tenant, wid = run.runtime.store, run.fence.tenant, run.workflow_id
    if await run.retried(lambda: store.get_step(tenant, wid, result.step)) is not None:
        return  # the usual case: the store had it, and the cache saved reading it
    record = StepRecord(
        tenant=tenant,
        workflow_id=wid,
        step=result.step,
        chat_id=result.chat_id,
        last_seen_message_id=result.last_seen_message_id,
        text=result.text,
        output=result.output,
        verdict=result.verdict if result.verdict in _RUN_VERDICTS else "ran",
        prompt_digest=prompt_digest(prompt),
        prompt=prompt,
        notes=[*result.notes, "recorded from Prefect's result cache"],
        usage=result.usage,
    )
    workflow = await run.retried(lambda: store.get_workflow(tenant, wid))
    spent = (workflow.spent if workflow else UsageTotals()) + result.usage
    await run.retried(lambda: store.complete_step(run.fence, record, spent))


#: How a step can have finished when it was run (a cached "stored" answer ran earlier).
_RUN_VERDICTS = frozenset({"ran", "recovered", "resubmitted"})
