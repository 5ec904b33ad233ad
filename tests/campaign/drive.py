"""Driving one workflow: runs with the same workflow id until one completes it.

Every planned run's child is spawned up front, so Python and Prefect import
while earlier runs work. A run is killed when its trigger is reached first, and
the next run takes over; a run that ends by itself either completed the
workflow or failed it, and a failed workflow has lost its results.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from tests.lab.children import Child, Returned
from tests.lab.steps import Kill, WorkflowPlan
from tests.lab.truth import prompts

from .arena import Arena
from .kills import InFlight, Trigger, in_flight
from .people import PersonRecord, act, spawn_changed

#: How long a run may take before it is taken for hung (killed, and counted failed).
RUN_TIMEOUT = 150.0
#: A refund run's: the example takes no settings, so a send it had in flight at a
#: crash keeps its 300 s commit horizon, which the next run sleeps out.
REFUND_RUN_TIMEOUT = 420.0


@dataclass
class RunRecord:
    number: int
    kill: Kill | None
    killed: bool = False
    exit_code: int | None = None
    seconds: float = 0.0
    in_flight: InFlight | None = None
    #: What the run's flow returned, when it completed.
    returned: Returned | None = None
    note: str = ""
    #: Whether it failed on the Prefect API itself, and whether its flow run had begun.
    api_trouble: bool = False
    began: bool = False

    def describe(self) -> str:
        if self.killed:
            outcome = f"killed ({self.kill.describe() if self.kill else '?'})"
        elif self.returned is not None:
            outcome = "completed"
        else:
            outcome = f"exited {self.exit_code}"
        return f"run {self.number} {outcome} after {self.seconds:.1f}s" + (
            f" [{self.note}]" if self.note else ""
        )


@dataclass
class WorkflowOutcome:
    plan: WorkflowPlan
    runs: list[RunRecord] = field(default_factory=list)
    #: Every step's result (``durable_chat`` returns them; a user's own flow's come from
    #: the store once it completed), or ``None`` when no run completed the workflow.
    results: list[dict[str, Any]] | None = None
    #: What the completing run's flow returned.
    returned: Returned | None = None
    #: What a person did between two runs, and what the checks of it found.
    person: PersonRecord | None = None

    @property
    def in_flight(self) -> list[InFlight]:
        return [r.in_flight for r in self.runs if r.in_flight is not None]

    def describe(self) -> str:
        runs = [r.describe() for r in self.runs]
        if self.person is not None:
            runs.insert(self.person.person.after_run, self.person.describe())
        return f"{self.plan.workflow_id}: " + ", ".join(runs)


class Children:
    """The workflow's children: one spawned per planned run ahead of time (ready, it runs
    at once when let go), taken in order; one spawned again if it died waiting."""

    def __init__(self, arena: Arena, plan: WorkflowPlan) -> None:
        self.arena, self.plan = arena, plan
        self.spares: dict[int, Child] = {}
        #: The child of a person's changed-prompt run, when the plan has one.
        self.changed: Child | None = None

    async def prepare(self) -> None:
        for run in range(1, len(self.plan.kills) + 2):
            self.spares[run] = await self._spawn(run)
        self.changed = await spawn_changed(self.arena, self.plan)

    async def take(self, run: int) -> Child:
        spare = self.spares.pop(run, None)
        return spare if spare is not None and spare.running else await self._spawn(run)

    async def _spawn(self, run: int) -> Child:
        arena = self.arena
        return await arena.lab.spawn(env=arena.machine_env(run), **arena.params(self.plan))


async def drive(arena: Arena, children: Children) -> WorkflowOutcome:
    """Run until a run completes the workflow or ends without being killed (failed):
    nothing re-runs a failed workflow by itself, so its results are lost."""
    plan = children.plan
    outcome = WorkflowOutcome(plan)
    while True:
        number = len(outcome.runs) + 1
        kill = plan.kills[number - 1] if number <= len(plan.kills) else None
        record = await run_once(arena, plan, await children.take(number), kill, number)
        outcome.runs.append(record)
        outcome.returned = record.returned
        if record.returned is not None and plan.refund is None:
            outcome.results = record.returned.value
        person = plan.person
        if record.killed and person is not None and person.after_run == number:
            outcome.person = await act(arena, plan, children.changed, number)
        if record.killed or unstarted(record, outcome):
            continue
        return outcome


def unstarted(record: RunRecord, outcome: WorkflowOutcome) -> bool:
    """A run the Prefect API refused before its flow began ran none of our code: run it
    again (twice at most); once it began, the API's failure makes the schedule void."""
    if not record.api_trouble:
        return False
    if record.began or sum(r.api_trouble for r in outcome.runs) > 2:
        raise PrefectApiTrouble(f"{outcome.plan.workflow_id}: {record.describe()}")
    return True


class PrefectApiTrouble(RuntimeError):
    """The shared Prefect API failed a run: the harness's trouble, not the code's."""


async def run_once(
    arena: Arena, plan: WorkflowPlan, child: Child, kill: Kill | None, number: int
) -> RunRecord:
    wf, loop = plan.workflow_id, asyncio.get_running_loop()
    record = RunRecord(number, kill)
    await arena.lab.ready(child)
    arena.gate.new_run(wf)
    trigger = Trigger(arena, wf, kill, len(prompts(arena.sim, wf))) if kill else None
    if trigger is not None:
        trigger.prime()
    started = loop.time()
    arena.lab.go(child)
    if plan is arena.schedule.workflows[0]:
        arena.go_times.append(started)
    exited = asyncio.ensure_future(child.proc.wait())
    reached = asyncio.ensure_future(trigger.reached()) if trigger else None
    try:
        waiting = [f for f in (exited, reached) if f is not None]
        timeout = RUN_TIMEOUT if plan.refund is None else REFUND_RUN_TIMEOUT
        await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if trigger is not None and reached is not None and reached.done() and child.running:
            reached.result()  # a trigger that broke is the harness's fault: say so
            await _kill(arena, trigger, child, record)
        else:
            if trigger is not None:
                await trigger.disarm()
            if child.running:
                await arena.lab.crash(child)
                record.note = f"hung for {timeout:.0f}s"
    finally:
        if reached is not None and not reached.done():
            reached.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reached
    record.exit_code = await exited
    record.seconds = loop.time() - started
    return conclude(record, child)


def conclude(record: RunRecord, child: Child) -> RunRecord:
    """What the run's end says: what its flow returned, or why it failed (a run that
    finished just as it was killed counts as completed)."""
    if record.exit_code == 0:
        record.returned = child.returned()
        record.killed = record.killed and record.returned is None
    if not record.killed and record.returned is None:
        record.note = record.note or failure_of(child)
        record.api_trouble = "PrefectHTTPStatusError" in record.note
        record.began = "Beginning flow run" in child.stderr.read_text(errors="replace")
    return record


def failure_of(child: Child) -> str:
    """Why a run failed, in one line: the flow run's final state, else its last words."""
    lines = [line.strip() for line in child.stderr.read_text(errors="replace").splitlines()]
    final = [line for line in lines if "Finished in state" in line and "Flow run" in line]
    last = (final or [line for line in lines if line] or ["no output"])[-1]
    return last.split("Finished in state", 1)[-1].strip()[:240]


async def _kill(arena: Arena, trigger: Trigger, child: Child, record: RunRecord) -> None:
    await arena.lab.crash(child)
    record.killed = True
    record.in_flight = await in_flight(arena, trigger.workflow_id)
    trigger.after_kill(record.in_flight)
