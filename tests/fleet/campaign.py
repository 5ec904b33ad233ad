"""A fleet campaign: schedules drawn from a seed, played one after another on one fleet.

Bringing a fleet up costs about a minute, so schedules share one (each schedule's
workflow ids are its own, and every check looks at its own workflows only); each
leaves the fleet healed (links up, routes and shaping gone, every worker running).
After a lab error the fleet is torn down and built afresh for the next schedule,
and with ``fresh`` every schedule gets a new one.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

from coder_chat.durable.postgres import PostgresStore
from tests.lab.report import Printer, Results

from .config import LEDGER_SCHEMA
from .draw import derive
from .lab import open_fleet
from .plan import FleetSchedule
from .report import (
    faults_line,
    recovery_line,
    schedule_line,
    summary_line,
    timing_line,
    violation_line,
)
from .schedule import ScheduleResult, run_schedule


@dataclass
class CampaignOptions:
    seed: int
    count: int = 5
    only: Sequence[int] = ()
    workers: int = 3
    workdir: Path = Path("/tmp/pcfleet-campaign")
    keep: bool = False
    fresh: bool = False


@dataclass
class CampaignReport(Results[ScheduleResult]):
    setup_seconds: float = 0.0


async def run_campaign(options: CampaignOptions, out: Printer, note: Printer) -> CampaignReport:
    started, report = time.monotonic(), CampaignReport()
    indexes = list(options.only) or list(range(options.count))
    schedules = [derive(options.seed, i, options.workers) for i in indexes]
    pending = list(schedules)
    while pending:
        await _one_fleet(options, pending, report, note)
    for result in report.results:
        if result.findings.violations:
            out(violation_line(result))
    out(summary_line(report.results))
    out(faults_line(report.results))
    out(recovery_line(report.results))
    note(timing_line(report.results, report.setup_seconds, time.monotonic() - started))
    return report


def _keep_logs(root: Path, workdir: Path, schedule: FleetSchedule) -> None:
    """The fleet's process logs as they stand (workers, server, simulator), for a schedule
    worth reading about: the fleet's folder goes with the fleet."""
    shutil.copytree(root / "logs", workdir / f"logs-{schedule.seed}-{schedule.index}")


async def _one_fleet(
    options: CampaignOptions,
    pending: list[FleetSchedule],
    report: CampaignReport,
    note: Printer,
) -> None:
    """Play schedules on one fleet until they run out, a lab error breaks it, or (with
    ``fresh``) after one."""
    total = len(pending) + len(report.results)
    root = options.workdir / f"fleet-{len(report.results)}"
    setup = time.monotonic()
    async with AsyncExitStack() as stack:
        fleet = await stack.enter_async_context(
            open_fleet(root, options.workers, keep=options.keep, say=note)
        )
        store = PostgresStore(fleet.store_dsn, schema=LEDGER_SCHEMA)
        stack.push_async_callback(store.close)
        report.setup_seconds += time.monotonic() - setup
        while pending:
            schedule = pending.pop(0)
            note(f"schedule {schedule.name}: {schedule.describe()}")
            result = await run_schedule(fleet, schedule, store, options.workdir)
            if result.findings.violations or result.error is not None:
                await asyncio.to_thread(_keep_logs, root, options.workdir, schedule)
            report.results.append(result)
            note(schedule_line(len(report.results), total, result))
            if result.error is not None:
                note(result.error)
            if result.error is not None or options.fresh:
                return
