"""``durable_chats``: many durable workflows side by side in one flow run.

A process worker starts one Python process per flow run (about 160 MB), so a
fleet of agent workflows, each mostly waiting on Coder, is cheaper as many
workflows in one process. Each is still its own workflow (a
:class:`~prefect_coder.chat.DurableChat`): its own ``workflow_id``, checkpoint,
fencing epoch, heartbeat and archive. The flow is a few lines on the public
:class:`~prefect_coder.fleet.DurableFleet`; your own flows can do the same. A workflow that fails is ended (its chat
archived, marked FAILED) while the others go on; the run fails at the end if any
did. A run that crashes is relaunched whole by the sweep, and its finished
workflows come back from the store; so is a run that lost the store for good
(it ends Crashed, marking nothing failed).
"""

import asyncio
from collections.abc import Sequence

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field

from coder_chat.durable.step import StepResult
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.chat import DEFAULT_SETTINGS, DurableChat
from prefect_coder.fleet import DurableFleet, FleetFailed, concurrency_slot
from prefect_coder.imports import import_model
from prefect_coder.settings import WorkflowSettings


class WorkflowSpec(BaseModel):
    """One workflow of the fleet: its id and its prompts, one per step."""

    model_config = ConfigDict(extra="forbid")

    workflow_id: str = Field(min_length=1, title="Workflow ID")
    prompts: list[str] = Field(min_length=1, title="Prompts")


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
    schemas = [import_model(path) for path in output_schemas]
    gate = asyncio.Semaphore(max(1, max_at_once))
    fleet = DurableFleet(
        [spec.workflow_id for spec in workflows],
        credentials=credentials,
        ledger=ledger,
        tools=tools,
        settings=settings,
    )

    async def one(spec: WorkflowSpec) -> None:
        async with gate, concurrency_slot(concurrency_limit):
            await _run_one(fleet, spec, schemas)

    async with fleet:
        await asyncio.gather(*(one(spec) for spec in workflows))
    return fleet.results


async def _run_one(
    fleet: DurableFleet, spec: WorkflowSpec, schemas: Sequence[type[BaseModel] | None]
) -> None:
    """One workflow: a turn per prompt, structured where the step has a schema."""

    async def turns(chat: DurableChat) -> None:
        for step, prompt in enumerate(spec.prompts, start=1):
            await chat.turn(prompt, output=schemas[step - 1] if step <= len(schemas) else None)

    await fleet.run(spec.workflow_id, turns, expected_turns=len(spec.prompts))


__all__ = ["FleetFailed", "WorkflowSpec", "durable_chats"]
