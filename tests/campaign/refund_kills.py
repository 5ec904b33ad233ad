"""Random SIGKILL schedules of a user's own flow in the crash lab: the README's ``refund_order``.

A schedule (:func:`draw_schedule`, from ``(seed, index)`` alone) is a refund case,
below or above the approval limit, the person's answer, and one or two kills: at a
random moment after the start, after a prompt landed, while the run waits for the
person, or inside ``issue_refund`` before or after the payments fake applied it.
:func:`play` scripts the simulator, lets an :class:`Approver` answer the paused flow
runs through Prefect's API, kills each planned run's process group where its kill
says, relaunches with the same parameters (a new flow run that pauses again and is
answered again, the same way), and lets the last run finish. :func:`judge` applies the
campaign's checks to what the peers recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from random import Random
from typing import Any
from uuid import UUID

from coder_chat.durable.sqlite import SqliteStore
from prefect_coder.payments import HeldCharge
from tests.campaign.approvals import Approver
from tests.campaign.charges import check_charges
from tests.campaign.checks import check_orphans
from tests.campaign.draw import DOUBLE_CRASH, refund_plan
from tests.campaign.drive import RunRecord, WorkflowOutcome
from tests.campaign.kills import read_in_flight
from tests.campaign.own_flows import check_returned, check_unplanned, stored_results
from tests.campaign.refunds import REFUND_ORDER, draw_case, draw_refund_kill, params_of, scripts_of
from tests.campaign.resends import check_resends
from tests.campaign.results import check_results
from tests.lab.children import REACH_TIMEOUT, CrashLab
from tests.lab.steps import Kill, RefundCase, WorkflowPlan
from tests.lab.truth import StatusLog, prompts
from tests.lab.verdicts import Findings


@dataclass(frozen=True)
class OwnFlowSchedule:
    seed: int
    index: int
    plan: WorkflowPlan

    @property
    def case(self) -> RefundCase:
        assert self.plan.refund is not None
        return self.plan.refund

    def describe(self) -> str:
        return f"schedule {self.seed}/{self.index}: {self.plan.describe()}"


def draw_schedule(seed: int, index: int) -> OwnFlowSchedule:
    """Odd indexes ask a person (above the limit), who approves every other time, from 1."""
    rng = Random(f"own-flow:{seed}:{index}")
    case = draw_case(rng, f"crash-{seed}-{index}", asks=index % 2 == 1)
    case = replace(case, approved=index % 4 == 1)
    kills = [draw_refund_kill(rng, case, run=1)]
    if rng.random() < DOUBLE_CRASH:
        kills.append(draw_refund_kill(rng, case, run=2))
    return OwnFlowSchedule(seed, index, refund_plan(case, tuple(kills)))


@dataclass
class Played:
    outcome: WorkflowOutcome
    statuses: StatusLog
    approver: Approver


async def play(lab: CrashLab, plan: WorkflowPlan, flow: str = REFUND_ORDER) -> Played:
    """Run ``plan`` with ``flow`` until a run completes it; kill each planned run."""
    case = plan.refund
    assert case is not None
    for when, then in scripts_of(case):
        lab.sim.script(when, then)
    params = params_of(case, flow)
    statuses, approver = StatusLog(), Approver(case.workflow_id, case.approved, case.answer_after)
    outcome = WorkflowOutcome(plan)
    async with statuses.polling(lab.sim), approver.watching(), opened(lab) as store:
        for number, kill in enumerate(plan.kills, start=1):
            record = await run_killed(lab, Run(approver, store, params), kill, number)
            outcome.runs.append(record)
            if not record.killed:
                break
        else:
            outcome.runs.append(await run_to_end(lab, params, len(outcome.runs) + 1))
    outcome.returned = outcome.runs[-1].returned
    return Played(outcome, statuses, approver)


@contextlib.asynccontextmanager
async def opened(lab: CrashLab) -> AsyncIterator[SqliteStore]:
    """The lab's store, read as a separate process would."""
    store = SqliteStore(lab.db)
    try:
        yield store
    finally:
        await store.close()


@dataclass
class Run:
    """What every run of one workflow shares."""

    approver: Approver
    store: SqliteStore
    params: dict[str, Any]

    @property
    def workflow_id(self) -> str:
        return self.approver.workflow_id


async def run_to_end(lab: CrashLab, params: dict[str, Any], number: int) -> RunRecord:
    started = asyncio.get_running_loop().time()
    returned = await lab.finish_flow(await lab.start(**params))
    seconds = asyncio.get_running_loop().time() - started
    return RunRecord(number, None, returned=returned, seconds=seconds)


async def run_killed(lab: CrashLab, run: Run, kill: Kill, number: int) -> RunRecord:
    """One run, killed where ``kill`` says; a run that ends first must have completed."""
    record, wf, approver = RunRecord(number, kill), run.workflow_id, run.approver
    started = asyncio.get_running_loop().time()
    prime(lab, approver, kill)
    baseline = len(prompts(lab.sim, wf))
    child = await lab.start(reruns=1, **run.params)  # the next run imports meanwhile
    reached = asyncio.ensure_future(reach(lab, approver, kill, wf, baseline))
    exited = asyncio.ensure_future(child.proc.wait())
    try:
        await asyncio.wait({reached, exited}, timeout=REACH_TIMEOUT, return_when="FIRST_COMPLETED")
        if reached.done() and child.running:
            held = reached.result()
            await lab.crash(child)
            record.killed = True
            record.seconds = asyncio.get_running_loop().time() - started
            settle(lab, approver, kill, held)
            record.in_flight = await read_in_flight(lab.sim, run.store, lab.tenant, wf)
            return record
    finally:
        if not reached.done():
            reached.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reached
    settle(lab, approver, kill, None)  # the run ended first: nothing stays armed
    record.returned = await lab.finish_flow(child)
    record.seconds = asyncio.get_running_loop().time() - started
    return record


def prime(lab: CrashLab, approver: Approver, kill: Kill) -> None:
    if kill.kind == "in-tool":
        lab.payments.hold(kill.phase)
    elif kill.kind == "paused":
        approver.hold()


async def reach(
    lab: CrashLab, approver: Approver, kill: Kill, wf: str, baseline: int
) -> HeldCharge | UUID | None:
    """Return at the kill moment: with the held charge or the paused run, if any."""
    if kill.kind == "in-tool":
        return await lab.payments.wait_held(timeout=REACH_TIMEOUT)
    if kill.kind == "paused":
        return await approver.held()
    if kill.kind == "after-prompt":
        await prompts_landed_in(lab, wf, baseline + kill.nth)
    await asyncio.sleep(kill.delay)
    return None


async def prompts_landed_in(lab: CrashLab, wf: str, count: int) -> None:
    while len(prompts(lab.sim, wf)) < count:  # noqa: ASYNC110 - the simulator's plain records
        await asyncio.sleep(0.01)


def settle(lab: CrashLab, approver: Approver, kill: Kill, held: HeldCharge | UUID | None) -> None:
    """After the kill: a refund held before it was applied is dropped (never applied),
    one held after it is released (applied, its answer lost with the process); the
    killed run's pause is never answered. Whatever stayed armed is taken back."""
    if isinstance(held, HeldCharge):
        lab.payments.decide(held.id, "drop" if held.phase == "before" else "release")
    lab.payments.clear()
    approver.let_go(dead=held if isinstance(held, UUID) else None)


async def judge(lab: CrashLab, played: Played) -> Findings:
    """The campaign's checks on the peers' records: effects, results, resends, archive."""
    sim, payments, outcome = lab.sim, lab.payments, played.outcome
    wf = outcome.plan.workflow_id
    async with opened(lab) as store:
        outcome.results = await stored_results(store, lab.tenant, wf)
    findings = check_charges(sim, payments)
    findings.merge(check_unplanned(sim, payments, [outcome.plan]))
    findings.merge(check_results(sim, payments, outcome, played.statuses))
    findings.merge(check_returned(outcome))
    findings.merge(check_resends(sim, outcome, played.statuses))
    findings.merge(check_orphans(sim, [wf]))  # no sweep here: the flow archived it itself
    return findings


def story(schedule: OwnFlowSchedule, played: Played, findings: Findings) -> str:
    """Everything needed to understand a failing schedule, in a few lines."""
    lines = [schedule.describe(), ", ".join(r.describe() for r in played.outcome.runs)]
    lines += [f"{v.category}: {v.detail}" for v in findings.violations]
    lines.append(f"pauses answered: {len(played.approver.answered)}")
    return "\n".join(lines)
