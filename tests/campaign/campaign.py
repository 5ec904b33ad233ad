"""The campaign: many schedules, a few at once, one shared Prefect API, one verdict.

Schedules run ``parallel`` at a time, each in its own arena, with a progress
line each as it ends. The Prefect API's part of the token search runs once,
after the last schedule; then one line per violating schedule, by index, and
the summary line.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from coder_chat.durable.records import utcnow
from tests.lab.report import Printer, Results
from tests.lab.steps import VARIANTS, Variant

from .draw import derive
from .leaks import api_leaks
from .report import (
    error_line,
    progress_line,
    redact,
    summary_line,
    timing_line,
    violation_line,
)
from .runner import ScheduleResult, Shared, run_schedule
from .stores import postgres_unusable


@dataclass
class CampaignOptions:
    seed: int
    count: int = 20
    parallel: int = 4
    #: Run only these indexes (a replay), instead of ``range(count)``.
    only: Sequence[int] = ()
    variants: Sequence[Variant] = VARIANTS
    workdir: Path | None = None
    #: Keep every schedule's folder, not only the violating ones'.
    keep: bool = False


@dataclass
class CampaignReport(Results[ScheduleResult]):
    seconds: float = 0.0

    @property
    def line(self) -> str:
        return summary_line(self.results)


def usable_variants(wanted: Sequence[Variant], note: Printer) -> list[Variant]:
    problem = postgres_unusable() if "postgres" in wanted else None
    if problem is not None:
        note(f"campaign: the postgres variant is left out: {problem}")
        return [v for v in wanted if v != "postgres"]
    return list(wanted)


async def run_campaign(
    options: CampaignOptions, api_url: str, out: Printer = print, note: Printer = print
) -> CampaignReport:
    """Run the schedules; ``out`` gets the violation lines, ``note`` progress and timing
    (the caller prints the summary line, :attr:`CampaignReport.line`)."""
    loop = asyncio.get_running_loop()
    started, since = loop.time(), utcnow()
    variants = usable_variants(options.variants, note)
    indexes = list(options.only) or list(range(options.count))
    schedules = [derive(options.seed, index, variants) for index in indexes]
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="prefect-coder-campaign-"))
    shared = Shared(api_url, workdir, keep=options.keep)
    gate, report = asyncio.Semaphore(options.parallel), CampaignReport()

    async def one(schedule_index: int) -> None:
        async with gate:
            result = await run_schedule(schedules[schedule_index], shared)
        report.results.append(result)
        note(progress_line(len(report.results), len(schedules), result))
        if result.error is not None:
            note(redact(result.error, result.token))

    try:
        await asyncio.gather(*(one(i) for i in range(len(schedules))))
    finally:
        await shared.clusters.close()
    await add_api_leaks(report, since)
    report.results.sort(key=lambda r: r.schedule.index)
    for result in report.results:
        if result.error is not None:
            out(error_line(result))
        elif result.findings.violations:
            out(violation_line(result))
    report.seconds = loop.time() - started
    note(timing_line(report.results, report.seconds, options.parallel))
    note(f"campaign: schedule folders under {workdir}")
    return report


async def add_api_leaks(report: CampaignReport, since: datetime) -> None:
    """The token search's API part, once for the campaign: log lines, artifacts, parameters."""
    by_token = {r.token: r for r in report.results if r.token}
    for token, places in (await api_leaks(by_token, since)).items():
        for place in places:
            by_token[token].findings.add(
                "token leaks", f"the session token is in the API's {place}"
            )
