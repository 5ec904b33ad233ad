"""What a fleet campaign prints: a line per schedule as it ends, then the totals."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean

from .schedule import ScheduleResult
from .verdicts import CATEGORIES

DETAILS = 3


def schedule_line(done: int, total: int, result: ScheduleResult) -> str:
    findings = result.findings
    if result.error is not None:
        state = "LAB ERROR: " + (result.error.strip().splitlines() or ["?"])[-1]
    else:
        counts = [f"{c} {findings.count(c)}" for c in CATEGORIES if findings.count(c)]
        state = ", ".join(counts) or "ok"
    return (
        f"[{done}/{total}] {result.schedule.name} {result.seconds:.0f}s: {state} "
        f"(late {findings.late}, cut short {findings.cut_short}, "
        f"unattributed {len(findings.unattributed)})"
    )


def violation_line(result: ScheduleResult) -> str:
    findings, schedule = result.findings, result.schedule
    details = "; ".join(v.detail for v in findings.violations[:DETAILS])
    more = len(findings.violations) - DETAILS
    where = f" | timeline: {result.timeline}" if result.timeline else ""
    return (
        f"VIOLATION {schedule.name}: [{details}{f'; +{more} more' if more > 0 else ''}] "
        f"| {schedule.describe()} | replay: {schedule.replay()}{where}"
    )


def summary_line(results: Sequence[ScheduleResult]) -> str:
    counts = {c: sum(r.findings.count(c) for r in results) for c in CATEGORIES}
    late = sum(r.findings.late for r in results)
    cut = sum(r.findings.cut_short for r in results)
    errors = sum(1 for r in results if r.error is not None)
    told = ", ".join(f"{c} {n}" for c, n in counts.items())
    return (
        f"fleet campaign: {len(results)} schedules, {sum(counts.values())} violations ({told}); "
        f"late duplicates {late}, cut-short resubmissions {cut}; lab errors {errors}"
    )


def timing_line(results: Sequence[ScheduleResult], setup: float, wall: float) -> str:
    each = [r.seconds for r in results] or [0.0]
    return (
        f"timing: {len(results)} schedules in {wall:.0f}s wall (fleet setups {setup:.0f}s); "
        f"each took {mean(each):.0f}s on average (min {min(each):.0f}s, max {max(each):.0f}s)"
    )
