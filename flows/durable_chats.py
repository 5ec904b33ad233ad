"""``durable_chats``: many durable workflows side by side in one flow run.

A process worker starts one Python process per flow run (about 160 MB), so a
fleet of agent workflows, each mostly waiting on Coder, is cheaper as many
workflows in one process. Each is still its own workflow: its own
``workflow_id``, checkpoint, fencing epoch, heartbeat and archive. A workflow
that fails is ended (its chat archived, marked FAILED) while the others go on;
the run fails at the end if any did. A run that crashes is relaunched whole by
the sweep, and its finished workflows come back from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from prefect import flow
from prefect.concurrency.asyncio import concurrency
from prefect.runtime import deployment as current_deployment
from prefect.runtime import flow_run as current_flow_run
from pydantic import BaseModel, ConfigDict, Field

from coder_chat.durable.step import StepResult
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.flows._workflow import Where, Workflow, begin, run_workflow, tally
from prefect_coder.tasks._runtime import run_log
from prefect_coder.tasks.lifecycle import end_failed_workflow
from prefect_coder.tasks.runs import Progress, supersede
from prefect_coder.tasks.settings import WorkflowSettings

DEFAULT_SETTINGS = WorkflowSettings()


class WorkflowSpec(BaseModel):
    """One workflow of the fleet: its id and its prompts, one per step."""

    model_config = ConfigDict(extra="forbid")

    workflow_id: str = Field(min_length=1, title="Workflow ID")
    prompts: list[str] = Field(min_length=1, title="Prompts")


class FleetFailed(Exception):
    """Some workflows of the fleet failed (each was ended and marked FAILED)."""

    def __init__(self, failed: dict[str, str], total: int) -> None:
        self.failed = failed
        listed = "; ".join(f"{wf}: {why}" for wf, why in sorted(failed.items()))
        super().__init__(f"{len(failed)} of {total} workflow(s) failed ({listed})")


@flow(name="durable-chats")
async def durable_chats(
    workflows: list[WorkflowSpec],
    tools: Sequence[str] = (),
    output_schemas: Sequence[str] = (),
    credentials: CoderCredentials | None = None,
    ledger: SqliteLedger | PostgresLedger | None = None,
    settings: WorkflowSettings = DEFAULT_SETTINGS,
    max_at_once: int = 50,
    concurrency_limit: str = "",
) -> dict[str, list[StepResult]]:
    """Run many durable workflows concurrently in this one flow run.

    Args:
        workflows: The workflows: each an id of your choosing and one prompt per step.
        tools: Client tools (import paths) every workflow may use.
        output_schemas: Per step, a pydantic model's import path for a structured answer.
        credentials: Saved Coder credentials (none: the worker's environment).
        ledger: Where progress is stored (none: the embedded SQLite store).
        settings: Each chat's setup and each step's time limits.
        max_at_once: At most this many workflows run at once in this flow run.
        concurrency_limit: The name of a Prefect global concurrency limit each running
            workflow holds a slot of, so that several workers share one budget (Coder's
            per-user chat quota, say); empty for none.
    """
    log = run_log()
    where = Where(current_flow_run.id, current_deployment.name or "local", name_the_run=False)
    fleet = [
        Workflow(w.workflow_id, w.prompts, tools, output_schemas, credentials, ledger, settings)
        for w in workflows
    ]
    progress = Progress("durable-chats", len(fleet), unit="workflow")
    await progress.start()
    gate = asyncio.Semaphore(max(1, max_at_once))
    replaced: set[str] = set()
    failed: dict[str, str] = {}
    results: dict[str, list[StepResult]] = {}

    async def one(wf: Workflow) -> None:
        async with gate, _slot(concurrency_limit):
            outcome = await _run_one(wf, where, replaced)
        if isinstance(outcome, str):
            failed[wf.workflow_id] = outcome
            await progress.advance(f"{wf.workflow_id}: failed ({outcome})")
        else:
            results[wf.workflow_id] = outcome
            await progress.advance(f"{wf.workflow_id}: {tally(outcome)}")

    await asyncio.gather(*(one(wf) for wf in fleet))
    log.info(f"{len(results)} of {len(fleet)} workflow(s) finished, {len(failed)} failed.")
    if failed:
        raise FleetFailed(failed, len(fleet))
    return results


async def _run_one(wf: Workflow, where: Where, replaced: set[str]) -> list[StepResult] | str:
    """Run one workflow; a failure ends it (archived, marked FAILED) and says why."""
    try:
        began = await begin(wf, where)
        if began.previous_run and began.previous_run not in replaced:
            replaced.add(began.previous_run)  # the whole fleet ran there: mark it once
            if where.flow_run_id:
                name = str(current_flow_run.name)
                await supersede(began.previous_run, where.flow_run_id, name, run_log())
        return await run_workflow(wf, where, began)
    except Exception as exc:  # noqa: BLE001 - one workflow's failure must not stop the others
        log = run_log()
        log.error(f"Workflow {wf.workflow_id} failed: {exc}")
        if where.flow_run_id:
            with contextlib.suppress(Exception):
                await end_failed_workflow(wf.failed(where.flow_run_id), log)
        return str(exc) or type(exc).__name__


@contextlib.asynccontextmanager
async def _slot(limit: str) -> AsyncIterator[None]:
    """A slot of the named global concurrency limit for the workflow's whole run."""
    if not limit:
        yield
        return
    async with concurrency(limit, occupy=1, strict=True):
        yield
