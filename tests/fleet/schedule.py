"""One schedule on a running fleet: play it, gather the evidence, judge it, tell its story."""

from __future__ import annotations

import asyncio
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from coder_chat.durable.store import DurableStore

from .checks import check_all
from .evidence import Evidence, gather
from .fleet import Fleet
from .plan import FleetSchedule
from .play import DEFAULT_LIMITS, Limits, play
from .timeline import write_timeline
from .verdicts import Findings


@dataclass
class ScheduleResult:
    schedule: FleetSchedule
    findings: Findings = field(default_factory=Findings)
    evidence: Evidence | None = None
    seconds: float = 0.0
    timeline: Path | None = None
    #: A failure of the lab itself (not of the code under test).
    error: str | None = None


async def run_schedule(
    fleet: Fleet,
    schedule: FleetSchedule,
    store: DurableStore,
    folder: Path,
    limits: Limits = DEFAULT_LIMITS,
) -> ScheduleResult:
    started, result = time.monotonic(), ScheduleResult(schedule)
    try:
        played = await play(fleet, schedule, store, limits)
        result.evidence = await gather(fleet, played, store)
        result.findings = check_all(result.evidence)
        result.timeline = folder / f"timeline-{schedule.seed}-{schedule.index}.txt"
        await asyncio.to_thread(write_timeline, result.evidence, result.findings, result.timeline)
    except Exception:  # noqa: BLE001 - the lab's own failure, reported, never hidden
        result.error = traceback.format_exc()
    result.seconds = time.monotonic() - started
    return result
