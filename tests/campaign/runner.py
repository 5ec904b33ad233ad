"""One schedule from start to end: its peers, its runs and kills, the sweep, the checks.

``run_schedule`` builds the arena (its own simulator with short timers, payments
fake, folder, store and crash lab), arms the knobs that start armed, drives every
workflow until a run completes or fails it, restarts Postgres on time, clears
the faults, sweeps once, and checks every invariant against ground truth. A
violating schedule's folder is kept, with a ``timeline.txt`` of what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import traceback
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

from coder_chat.errors import CoderError
from coder_chat.simulator import serve_simulator
from prefect_coder.payments import serve_payments
from tests.lab.children import CrashLab
from tests.lab.steps import RefundCase, Schedule
from tests.lab.tasks import cancel_all
from tests.lab.verdicts import Findings
from tests.sim_timings import fast_config

from .admin import Admin
from .approvals import Approver
from .arena import Arena
from .checks import check_schedule
from .drive import Children, WorkflowOutcome, drive
from .gate import ChargeGate
from .kills import prompts_landed
from .refunds import scripts_of
from .stores import ClusterPool, StoreSite
from .sweeping import sweep_once
from .timeline import write_timeline


@dataclass
class Shared:
    """What every schedule of a campaign shares: the Prefect API, the work folder, Postgres."""

    api_url: str
    workdir: Path
    clusters: ClusterPool = field(default_factory=ClusterPool)
    keep: bool = False


@dataclass
class ScheduleResult:
    schedule: Schedule
    findings: Findings = field(default_factory=Findings)
    outcomes: list[WorkflowOutcome] = field(default_factory=list)
    seconds: float = 0.0
    token: str = ""
    root: Path | None = None
    notes: list[str] = field(default_factory=list)
    #: A failure of the harness itself (not of the code under test).
    error: str | None = None


async def run_schedule(schedule: Schedule, shared: Shared) -> ScheduleResult:
    loop = asyncio.get_running_loop()
    started, result = loop.time(), ScheduleResult(schedule)
    root = shared.workdir / f"schedule-{schedule.seed}-{schedule.index}-{schedule.variant}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    result.root = root
    try:
        async with arena_for(schedule, root, shared) as arena:
            result.token = arena.sim.token
            result.outcomes = await play(arena)
            result.findings = await check_schedule(arena, result.outcomes)
            result.notes = arena.notes
            if result.findings.violations:
                write_timeline(arena, result.outcomes, result.findings)
    except Exception:  # noqa: BLE001 - reported as the harness's own failure, never hidden
        result.error = traceback.format_exc()
    result.seconds = loop.time() - started
    if not result.findings.violations and result.error is None and not shared.keep:
        shutil.rmtree(root, ignore_errors=True)
    return result


@contextlib.asynccontextmanager
async def arena_for(schedule: Schedule, root: Path, shared: Shared) -> AsyncIterator[Arena]:
    async with AsyncExitStack() as stack:
        # The server-side tool deadline passes only when a knob shortens it.
        sim = await stack.enter_async_context(
            serve_simulator(fast_config(tool_result_deadline=600.0))
        )
        payments_url, payments = await stack.enter_async_context(serve_payments())
        lab = CrashLab(sim, payments_url, payments, root, shared.api_url)
        stack.push_async_callback(lab.close)
        site = await site_for(schedule, root, shared, stack)
        store = site.open()
        stack.push_async_callback(store.close)
        admin = await stack.enter_async_context(Admin(sim.base_url, sim.token))
        gate = await stack.enter_async_context(ChargeGate(payments, sim).holding())
        arena = Arena(schedule, root, sim, lab, admin, gate, site, store)
        await stack.enter_async_context(arena.statuses.polling(sim))
        yield arena


async def site_for(
    schedule: Schedule, root: Path, shared: Shared, stack: AsyncExitStack
) -> StoreSite:
    if schedule.variant != "postgres":
        return StoreSite.sqlite(root)
    cluster = await shared.clusters.acquire()
    stack.callback(shared.clusters.release, cluster)
    site = await StoreSite.postgres(root, cluster, f"campaign-{schedule.seed}-{schedule.index}")
    stack.push_async_callback(site.drop)
    return site


async def play(arena: Arena) -> list[WorkflowOutcome]:
    """Run the schedule's workflows to their end, then clear every fault and sweep once."""
    async with AsyncExitStack() as stack:
        for plan in arena.schedule.workflows:
            if plan.refund is not None:
                await stack.enter_async_context(refund_watch(arena, plan.refund))
        outcomes = await play_workflows(arena)
    arena.archived_before_sweep = {str(c.id) for c in arena.sim.chats() if c.archived}
    await sweep(arena)
    return outcomes


@contextlib.asynccontextmanager
async def refund_watch(arena: Arena, case: RefundCase) -> AsyncIterator[Approver]:
    """The refund flow's script on the simulator, and a person answering its pauses."""
    for when, then in scripts_of(case):
        await arena.admin.script(when, then)
    approver = Approver(case.workflow_id, case.approved, case.answer_after)
    arena.approvers[case.workflow_id] = approver
    async with approver.watching():
        yield approver


async def play_workflows(arena: Arena) -> list[WorkflowOutcome]:
    """Drive every workflow to its end, arming knobs and restarting Postgres on time."""
    children = [Children(arena, plan) for plan in arena.schedule.workflows]
    for each in children:
        await each.prepare()
    for knob in arena.schedule.knobs:
        if knob.after_prompts == 0:
            await arena.admin.arm(knob)
    knobs = asyncio.create_task(arm_later(arena))
    restarts = asyncio.create_task(restart_postgres(arena))
    try:
        outcomes = await asyncio.gather(*(drive(arena, each) for each in children))
    finally:
        arena.finished.set()
        await cancel_all([knobs, *arena.background])
        await restarts  # never cut short: a restart in progress is let finish
    await arena.admin.clear()
    await arena.lab.close()
    return list(outcomes)


async def arm_later(arena: Arena) -> None:
    first = arena.schedule.workflows[0].workflow_id
    for knob in sorted(arena.schedule.knobs, key=lambda k: k.after_prompts):
        if knob.after_prompts > 0:
            await prompts_landed(arena, first, knob.after_prompts)
            await arena.admin.arm(knob)


async def restart_postgres(arena: Arena) -> None:
    loop = asyncio.get_running_loop()
    for restart in arena.schedule.pg_restarts:
        while len(arena.go_times) < restart.run:
            if arena.finished.is_set():
                return
            await asyncio.sleep(0.01)
        due = arena.go_times[restart.run - 1] + restart.delay - loop.time()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(arena.finished.wait(), max(0.0, due))
        if arena.finished.is_set():
            return
        await arena.site.restart()
        arena.restarts_done += 1
        arena.notes.append(f"postgres restarted ({restart.describe()})")


async def sweep(arena: Arena) -> None:
    for _ in range(3):
        try:
            await sweep_once(arena.sim, arena.store, arena.lab.payments_url, arena.sweep_lines)
            return
        except (CoderError, TimeoutError) as exc:
            arena.notes.append(f"sweep failed: {type(exc).__name__}: {exc}")
            await asyncio.sleep(1.0)
