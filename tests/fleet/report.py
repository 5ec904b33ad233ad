"""What a fleet campaign prints: a line per schedule as it ends, then the totals."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from statistics import median

from tests.lab.report import took

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
    return (
        f"timing: {len(results)} schedules in {wall:.0f}s wall (fleet setups {setup:.0f}s); "
        f"{took([r.seconds for r in results], digits=0)}"
    )


def faults_line(results: Sequence[ScheduleResult]) -> str:
    """How many faults of each kind struck (drawn ones whose moment never came aside)."""
    struck: Counter[str] = Counter()
    drawn: Counter[str] = Counter()
    for result in results:
        if result.evidence is None:
            continue
        for record in result.evidence.played.faults:
            drawn[record.fault.kind] += 1
            if record.started is not None:
                struck[record.fault.kind] += 1
    told = ", ".join(f"{kind} {struck[kind]}/{drawn[kind]}" for kind in sorted(drawn))
    return f"faults struck/drawn by kind: {told or 'none'}"


def recovery_line(results: Sequence[ScheduleResult]) -> str:
    """Seconds from a fault that silenced a workflow's run to its relaunch and to its end."""
    parts = []
    kinds = sorted({k for r in results for k, _, _ in r.findings.recoveries})
    for kind in kinds:
        found = [(t, e) for r in results for k, t, e in r.findings.recoveries if k == kind]
        relaunch = [t for t, _ in found]
        ends = [e for _, e in found if e is not None]
        parts.append(
            f"{kind} x{len(found)}: relaunched p50 {median(relaunch):.1f}s max "
            f"{max(relaunch):.1f}s; finished p50 {median(ends) if ends else 0:.1f}s max "
            f"{max(ends) if ends else 0:.1f}s"
        )
    return "recovery after a fault: " + ("; ".join(parts) or "none measured")
