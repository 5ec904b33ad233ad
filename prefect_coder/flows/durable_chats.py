"""``durable_chats``: many durable workflows side by side in one flow run.

A process worker starts one Python process per flow run (about 160 MB), so a
fleet of agent workflows, each mostly waiting on Coder, is cheaper as many
workflows in one process. Each is still its own workflow (a
:class:`~prefect_coder.chat.DurableChat`): its own ``workflow_id``, checkpoint,
fencing epoch, heartbeat and archive. A workflow that fails is ended (its chat
archived, marked FAILED) while the others go on; the run fails at the end if any
did. A run that crashes is relaunched whole by the sweep, and its finished
workflows come back from the store; so is a run that lost the store for good
(it ends Crashed, marking nothing failed).
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from prefect import flow
from prefect.concurrency.asyncio import concurrency
from prefect.logging.loggers import LoggingAdapter
from prefect.runtime import flow_run as current_flow_run
from pydantic import BaseModel, ConfigDict, Field

from coder_chat.durable.step import StepResult
from coder_chat.durable.store import FencedOut
from prefect_coder._run.artifacts import Progress
from prefect_coder._run.heap import heap_frozen
from prefect_coder._run.imports import import_model
from prefect_coder._run.logs import run_log
from prefect_coder._run.marks import end_lost, end_superseded, supersede
from prefect_coder._run.naming import name_the_run, slug
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.chat import DEFAULT_SETTINGS, DurableChat, StoreLost, Superseded
from prefect_coder.settings import WorkflowSettings


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


def fleet_name(workflows: Sequence[WorkflowSpec]) -> str:
    """``3 workflows: ticket-1, ticket-2, ticket-3`` (the first few, then how many more)."""
    ids = [w.workflow_id for w in workflows]
    shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
    return f"{len(ids)} workflow{'s' if len(ids) != 1 else ''}: {shown}"


@dataclass(frozen=True)
class ChatOptions:
    """What every workflow of the fleet is run with."""

    credentials: CoderCredentials | None
    ledger: SqliteLedger | PostgresLedger | None
    tools: Sequence[str]
    settings: WorkflowSettings

    def chat(self, spec: WorkflowSpec) -> DurableChat:
        return DurableChat(
            spec.workflow_id,
            credentials=self.credentials,
            ledger=self.ledger,
            tools=self.tools,
            settings=self.settings,
            expected_turns=len(spec.prompts),
            owns_run=False,
        )


@dataclass
class Fleet:
    """What one flow run of many workflows shares while they run."""

    options: ChatOptions
    progress: Progress
    this_run: str | None
    name: str
    #: Runs this one replaced, each marked superseded once (the whole fleet ran there).
    replaced: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    #: Workflows that lost the store through every retry: left running, marked nothing.
    lost: dict[str, str] = field(default_factory=dict)
    superseded: list[FencedOut] = field(default_factory=list)
    results: dict[str, list[StepResult]] = field(default_factory=dict)


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
    fleet = await _fleet(workflows, tools, credentials, ledger, settings)
    schemas = [import_model(path) for path in output_schemas]
    gate = asyncio.Semaphore(max(1, max_at_once))

    async def one(spec: WorkflowSpec) -> None:
        async with gate, _slot(concurrency_limit):
            await _run_one(spec, schemas, fleet)

    with heap_frozen():
        await asyncio.gather(*(one(spec) for spec in workflows))
    await fleet.progress.flush(finished=True)
    if fleet.superseded and fleet.this_run:
        await end_superseded(fleet.this_run, None, log)
        raise Superseded(str(fleet.superseded[0]))
    await _end_if_lost(fleet, log)
    log.info(
        f"{len(fleet.results)} of {len(workflows)} workflow(s) finished, "
        f"{len(fleet.failed)} failed."
    )
    if fleet.failed:
        raise FleetFailed(fleet.failed, len(workflows))
    return fleet.results


async def _fleet(
    workflows: Sequence[WorkflowSpec],
    tools: Sequence[str],
    credentials: CoderCredentials | None,
    ledger: SqliteLedger | PostgresLedger | None,
    settings: WorkflowSettings,
) -> Fleet:
    """Name the run after its workflows and start its progress artifact."""
    this_run = current_flow_run.id
    name = fleet_name(workflows)
    if this_run is not None:
        name = await name_the_run(this_run, current_flow_run.name or "", name, run_log())
    key = f"progress-{slug(workflows[0].workflow_id if workflows else 'fleet')}"
    progress = Progress(
        name,
        len(workflows),
        key=f"{key}-{(this_run or 'local')[:8]}",
        unit="workflow",
    )
    await progress.start()
    return Fleet(ChatOptions(credentials, ledger, tools, settings), progress, this_run, name)


async def _run_one(spec: WorkflowSpec, schemas: list[type[BaseModel] | None], fleet: Fleet) -> None:
    """Run one workflow; a failure ends it (archived, marked FAILED) and is counted."""
    chat = fleet.options.chat(spec)
    try:
        async with chat:
            await _supersede_once(chat, fleet)
            for step, prompt in enumerate(spec.prompts, start=1):
                await chat.turn(prompt, output=schemas[step - 1] if step <= len(schemas) else None)
    except FencedOut as exc:
        fleet.superseded.append(exc)
        return
    except StoreLost as exc:
        fleet.lost[spec.workflow_id] = str(exc)
        await fleet.progress.advance(f"{spec.workflow_id}: left running (lost the store)")
        return
    except Exception as exc:  # noqa: BLE001 - one workflow's failure must not stop the others
        why = str(exc) or type(exc).__name__
        fleet.failed[spec.workflow_id] = why
        await fleet.progress.advance(f"{spec.workflow_id}: failed ({why})")
        return
    fleet.results[spec.workflow_id] = chat.results
    await fleet.progress.advance(f"{spec.workflow_id}: {chat.summary()}")


async def _end_if_lost(fleet: Fleet, log: LoggingAdapter) -> None:
    """Some workflows lost the store for good: the run ends Crashed, for the sweep to
    relaunch it whole (its finished workflows come back from the store). When Prefect's
    API cannot be told so either, they count as failed."""
    if not fleet.lost:
        return
    why = next(iter(fleet.lost.values()))
    if fleet.this_run and await end_lost(fleet.this_run, why, log, workflows=len(fleet.lost)):
        raise StoreLost(why)
    fleet.failed.update(fleet.lost)


async def _supersede_once(chat: DurableChat, fleet: Fleet) -> None:
    previous = chat.previous_run
    if previous and fleet.this_run and previous not in fleet.replaced:
        fleet.replaced.add(previous)
        await supersede(previous, fleet.this_run, fleet.name, run_log())


@contextlib.asynccontextmanager
async def _slot(limit: str) -> AsyncIterator[None]:
    """A slot of the named global concurrency limit for the workflow's whole run."""
    if not limit:
        yield
        return
    async with concurrency(limit, occupy=1, strict=True):
        yield
