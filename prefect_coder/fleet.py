"""Many durable workflows side by side in one flow run: :class:`DurableFleet`.

A process worker starts one Python process per flow run (about 160 MB), so a fleet of agent
workflows, each mostly waiting on Coder, is cheaper as many workflows in one process. Each is
still its own workflow (a :class:`~prefect_coder.chat.DurableChat`): its own ``workflow_id``,
checkpoint, fencing epoch, heartbeat and archive. ``durable_chats`` is a flow of this kind;
yours can be one too::

    @flow
    async def nightly(tickets: list[str]) -> None:
        async with DurableFleet(tickets) as fleet:

            async def review(chat: DurableChat) -> None:
                await chat.turn("Review the ticket.")
                await chat.turn("Summarise what you changed.")

            runs = [fleet.run(ticket, review, expected_turns=2) for ticket in tickets]
            await asyncio.gather(*runs)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from prefect.concurrency.asyncio import concurrency
from prefect.runtime import flow_run as current_flow_run

from coder_chat import CoderConfigError
from coder_chat.durable.budget import OverBudget
from coder_chat.durable.step import StepResult
from coder_chat.durable.store import FencedOut
from coder_chat.protocol.usage import UsageTotals
from prefect_coder._run.artifacts import Progress
from prefect_coder._run.heap import heap_frozen
from prefect_coder._run.logs import run_log
from prefect_coder._run.marks import end_lost, end_superseded, supersede
from prefect_coder._run.naming import name_the_run, slug
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.chat import DEFAULT_SETTINGS, DurableChat
from prefect_coder.exceptions import StoreLost, Superseded
from prefect_coder.imports import ToolLike
from prefect_coder.settings import WorkflowSettings

#: What a fleet does with one of its workflows, given its chat (entered): take its turns.
Turns = Callable[[DurableChat], Awaitable[None]]


class FleetFailed(Exception):
    """Some workflows of the fleet failed (each was ended and marked FAILED)."""

    def __init__(self, failed: dict[str, str], total: int) -> None:
        self.failed = failed
        listed = "; ".join(f"{wf}: {why}" for wf, why in sorted(failed.items()))
        super().__init__(f"{len(failed)} of {total} workflow(s) failed ({listed})")


def fleet_name(workflow_ids: Sequence[str]) -> str:
    """``3 workflows: ticket-1, ticket-2, ticket-3`` (the first few, then how many more)."""
    ids = list(workflow_ids)
    shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
    return f"{len(ids)} workflow{'s' if len(ids) != 1 else ''}: {shown}"


@dataclass
class _Outcomes:
    """What became of the fleet's workflows, as they end."""

    results: dict[str, list[StepResult]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    #: Workflows that lost the store through every retry: left running, marked nothing.
    lost: dict[str, str] = field(default_factory=dict)
    superseded: list[FencedOut] = field(default_factory=list)
    #: Workflows that reached a limit of their budget (or Coder's): ended, not failed.
    over_budget: dict[str, str] = field(default_factory=dict)
    #: What each workflow used that finished or went over budget here.
    used: dict[str, UsageTotals] = field(default_factory=dict)
    #: Runs this one replaced, each marked superseded once (the whole fleet ran there).
    replaced: set[str] = field(default_factory=set)


class DurableFleet:
    """One flow run's many durable workflows.

    Entered, it names the run after its workflows and starts one progress artifact over them.
    :meth:`run` runs one workflow as a :class:`~prefect_coder.chat.DurableChat` of its own; a
    workflow that fails is ended (its chat archived, marked FAILED) while the others go on.
    How many run at once is the flow's to decide (``durable_chats``: an ``asyncio.Semaphore``,
    and a slot of a global concurrency limit each, :func:`concurrency_slot`). On the way out the run ends as the
    durable contract says: Superseded when a newer run took a workflow, Crashed (``StoreLost``)
    when a workflow lost the store for good, for the sweep to relaunch it whole, and
    :class:`FleetFailed` when any workflow failed.
    """

    def __init__(
        self,
        workflow_ids: Sequence[str],
        *,
        credentials: CoderCredentials | None = None,
        ledger: SqliteLedger | PostgresLedger | None = None,
        tools: Sequence[ToolLike] = (),
        settings: WorkflowSettings = DEFAULT_SETTINGS,
    ) -> None:
        self.workflow_ids = list(workflow_ids)
        repeated = sorted({w for w in self.workflow_ids if self.workflow_ids.count(w) > 1})
        if repeated:
            # Two chats of one workflow in one run would each take the other's epoch.
            raise CoderConfigError(f"a fleet names each workflow once; repeated: {repeated}")
        self._credentials, self._ledger, self._tools = credentials, ledger, tools
        self._settings = settings
        self._outcomes = _Outcomes()
        self._this_run: str | None = None
        self._name = fleet_name(self.workflow_ids)
        self._progress: Progress | None = None
        self._heap = contextlib.ExitStack()

    @property
    def results(self) -> dict[str, list[StepResult]]:
        """Each finished workflow's results, by workflow id."""
        return self._outcomes.results

    async def __aenter__(self) -> DurableFleet:
        self._this_run = current_flow_run.id
        if self._this_run is not None:
            flow_name = current_flow_run.name or ""
            self._name = await name_the_run(self._this_run, flow_name, self._name, run_log())
        first = self.workflow_ids[0] if self.workflow_ids else "fleet"
        key = f"progress-{slug(first)}-{(self._this_run or 'local')[:8]}"
        self._progress = Progress(self._name, len(self.workflow_ids), key=key, unit="workflow")
        await self._progress.start()
        self._heap.enter_context(heap_frozen())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._heap.close()
        if exc_info[1] is None:  # an error on the way (a cancellation) ends nothing here
            await self._end()

    async def run(
        self, workflow_id: str, turns: Turns, *, expected_turns: int | None = None
    ) -> None:
        """Run one workflow: its chat entered, ``turns`` taken in it. A failure ends that
        workflow alone, and is counted (nothing is raised here). A workflow the fleet was
        not given is refused: its totals and its run's name would not say it."""
        if workflow_id not in self.workflow_ids:
            raise CoderConfigError(f"workflow {workflow_id!r} is not one of this fleet's")
        outcomes, progress = self._outcomes, self._entered_progress()
        try:
            chat = self._chat(workflow_id, expected_turns)
            async with chat:
                await self._supersede_once(chat)
                await turns(chat)
        except FencedOut as exc:
            outcomes.superseded.append(exc)
            return
        except StoreLost as exc:
            outcomes.lost[workflow_id] = str(exc)
            await progress.advance(f"{workflow_id}: left running (lost the store)")
            return
        except OverBudget as exc:
            outcomes.over_budget[workflow_id], outcomes.used[workflow_id] = exc.why, chat.usage
            await progress.advance(f"{workflow_id}: over budget ({exc.why})")
            return
        except Exception as exc:  # noqa: BLE001 - one workflow's failure must not stop the others
            why = str(exc) or type(exc).__name__
            outcomes.failed[workflow_id] = why
            await progress.advance(f"{workflow_id}: failed ({why})")
            return
        outcomes.results[workflow_id], outcomes.used[workflow_id] = chat.results, chat.usage
        await progress.advance(f"{workflow_id}: {chat.summary()}")

    def _chat(self, workflow_id: str, expected_turns: int | None) -> DurableChat:
        return DurableChat(
            workflow_id,
            credentials=self._credentials,
            ledger=self._ledger,
            tools=self._tools,
            settings=self._settings,
            expected_turns=expected_turns,
            owns_run=False,
        )

    def _entered_progress(self) -> Progress:
        if self._progress is None:
            raise RuntimeError("use the DurableFleet in 'async with' before running workflows")
        return self._progress

    async def _supersede_once(self, chat: DurableChat) -> None:
        previous, replaced = chat.previous_run, self._outcomes.replaced
        if previous and self._this_run and previous not in replaced:
            replaced.add(previous)
            await supersede(previous, self._this_run, self._name, run_log())

    async def _end(self) -> None:
        outcomes, log = self._outcomes, run_log()
        used = sum(outcomes.used.values(), UsageTotals())
        footer = f"In all, the workflows used {used.describe()}." if used.messages else None
        await self._entered_progress().end(footer)
        if outcomes.superseded and self._this_run:
            ended = await end_superseded(self._this_run, None, log)
            raise Superseded(str(outcomes.superseded[0]), ended)
        await self._end_if_lost()
        total = len(self.workflow_ids)
        over = f", {len(outcomes.over_budget)} over budget" if outcomes.over_budget else ""
        log.info(
            f"{len(outcomes.results)} of {total} workflow(s) finished, "
            f"{len(outcomes.failed)} failed{over}."
        )
        if outcomes.failed:
            raise FleetFailed(outcomes.failed, total)

    async def _end_if_lost(self) -> None:
        """Some workflows lost the store for good: the run ends Crashed, for the sweep to
        relaunch it whole (its finished workflows come back from the store). When Prefect's
        API cannot be told so either, they count as failed."""
        outcomes = self._outcomes
        if not outcomes.lost:
            return
        why = next(iter(outcomes.lost.values()))
        lost = len(outcomes.lost)
        ended = (
            await end_lost(self._this_run, why, run_log(), workflows=lost)
            if self._this_run
            else None
        )
        if ended is not None:
            raise StoreLost(why, ended)
        outcomes.failed.update(outcomes.lost)


@contextlib.asynccontextmanager
async def concurrency_slot(limit: str) -> AsyncIterator[None]:
    """A slot of Prefect's global concurrency limit named ``limit`` (none when empty), held
    for as long as the block inside runs: one workflow's whole run, say, so that several
    workers share one budget (Coder's per-user chat quota)."""
    if not limit:
        yield
        return
    async with concurrency(limit, occupy=1, strict=True):
        yield


__all__ = ["DurableFleet", "FleetFailed", "Turns", "concurrency_slot", "fleet_name"]
