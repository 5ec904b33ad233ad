"""One durable workflow, start to end: what ``durable_chat`` runs once and
``durable_chats`` runs many times side by side in one flow run."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import cast

from prefect.client.schemas.objects import State

from coder_chat.durable.records import WorkflowState
from coder_chat.durable.step import StepResult
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.tasks import archive_chat, run_turn
from prefect_coder.tasks._runtime import run_log
from prefect_coder.tasks.lifecycle import FailedWorkflow
from prefect_coder.tasks.runs import Progress
from prefect_coder.tasks.settings import WorkflowSettings
from prefect_coder.tasks.turns import VERDICT_WORDS
from prefect_coder.tasks.workflow import (
    Began,
    begin_workflow,
    finish_workflow,
    heartbeat_forever,
    publish_transcript,
)


@dataclass(frozen=True)
class Workflow:
    """A workflow's parameters: its id and steps, and how they run."""

    workflow_id: str
    prompts: Sequence[str]
    tools: Sequence[str] = ()
    output_schemas: Sequence[str] = ()
    credentials: CoderCredentials | None = None
    ledger: SqliteLedger | PostgresLedger | None = None
    settings: WorkflowSettings = field(default_factory=WorkflowSettings)

    def failed(self, flow_run_id: str) -> FailedWorkflow:
        """What the end of a failed run needs to know of this workflow."""
        return FailedWorkflow(
            self.workflow_id, flow_run_id, self.tools, self.settings, self.credentials, self.ledger
        )


@dataclass(frozen=True)
class Where:
    """Where a workflow runs: its flow run and deployment, and who names the run."""

    flow_run_id: str | None
    deployment: str
    #: A flow run of one workflow is named after it; one of many is not.
    name_the_run: bool = True


async def begin(wf: Workflow, where: Where) -> Began:
    return await begin_workflow(
        wf.workflow_id,
        where.deployment,
        where.flow_run_id,
        wf.credentials,
        wf.ledger,
        archive_at_end=wf.settings.archive_at_end,
        name_the_run=where.name_the_run,
    )


async def run_workflow(
    wf: Workflow, where: Where, began: Began, progress: Progress | None = None
) -> list[StepResult]:
    """Every step, in order, on the workflow's chat; then the transcript, the archive and
    the end. The heartbeat runs all along."""
    beat = asyncio.create_task(
        heartbeat_forever(
            wf.workflow_id, began.epoch, wf.settings.heartbeat_seconds, wf.credentials, wf.ledger
        )
    )
    try:
        results = await _steps(wf, where, began, progress)
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
    await publish_transcript(wf.workflow_id, results, wf.credentials, wf.ledger)
    if wf.settings.archive_at_end:
        await archive_chat(
            workflow_id=wf.workflow_id,
            epoch=began.epoch,
            tools=wf.tools,
            settings=wf.settings,
            credentials=wf.credentials,
            ledger=wf.ledger,
        )
    await finish_workflow(
        wf.workflow_id, began.epoch, WorkflowState.FINISHED, wf.credentials, wf.ledger
    )
    return results


async def _steps(
    wf: Workflow, where: Where, began: Began, progress: Progress | None
) -> list[StepResult]:
    results: list[StepResult] = []
    steps = len(wf.prompts)
    for step, prompt in enumerate(wf.prompts, start=1):
        # An async task called with return_state gives a coroutine of its state
        # (Prefect's overloads say State; the runtime says otherwise).
        call = run_turn(
            tenant=began.tenant,
            workflow_id=wf.workflow_id,
            step=step,
            steps=steps,
            prompt=prompt,
            epoch=began.epoch,
            tools=wf.tools,
            output_schema=wf.output_schemas[step - 1] if step <= len(wf.output_schemas) else "",
            settings=wf.settings,
            deployment=where.deployment,
            declare_structured_output=any(wf.output_schemas),
            credentials=wf.credentials,
            ledger=wf.ledger,
            return_state=True,
        )
        state = await cast(Awaitable[State[StepResult]], call)
        result = await state.aresult()
        if state.name == "Cached":  # Prefect's cache answered: nothing ran this time
            result = result.model_copy(update={"verdict": "cached"})
            run_log().info(f"Step {step} of {steps}: cached ({VERDICT_WORDS['cached']}).")
        results.append(result)
        if progress is not None:
            # Beyond "ran", the verdict is a recovery decision: say it here too, where
            # a later kill of this process cannot erase it.
            why = "" if result.verdict == "ran" else f" ({VERDICT_WORDS[result.verdict]})"
            await progress.advance(f"step {step}: {result.verdict}{why}")
    return results


def tally(results: list[StepResult]) -> str:
    """``3 step(s), 2 ran, 1 recovered``."""
    counts: dict[str, int] = {}
    for result in results:
        counts[result.verdict] = counts.get(result.verdict, 0) + 1
    return f"{len(results)} step(s), " + ", ".join(f"{n} {v}" for v, n in counts.items())
