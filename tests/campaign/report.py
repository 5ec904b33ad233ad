"""What a campaign prints: one line per violating schedule, then one summary line.

Counts are of occurrences: double charges per logical call (or key) booked twice,
unwanted effects per logical call no step asked for, lost results per step, resent finished steps per resent prompt, live orphans per
chat, token leaks per place; late duplicates and cut-short resubmissions per prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from tests.lab.report import took
from tests.lab.verdicts import CATEGORIES

from .runner import ScheduleResult

DETAILS = 4


def summary_line(results: Sequence[ScheduleResult]) -> str:
    counts = {c: sum(r.findings.count(c) for r in results) for c in CATEGORIES}
    late = sum(r.findings.late for r in results)
    cut = sum(r.findings.cut_short for r in results)
    people = counts["people's actions"]
    return (
        f"campaign: {len(results)} schedules, {sum(counts.values())} violations "
        f"(double charges {counts['double charges']}, "
        f"unwanted effects {counts['unwanted effects']}, lost results {counts['lost results']}, "
        f"resent finished steps {counts['resent finished steps']}, "
        f"live orphans {counts['live orphans']}, token leaks {counts['token leaks']}, "
        f"people's actions {people}, miscounted usage {counts['miscounted usage']}); "
        f"late duplicates {late}, cut-short resubmissions {cut}; {people_line(results)}"
    )


def people_line(results: Sequence[ScheduleResult]) -> str:
    """How many workflows drew each person's action, and how many took it (a changed
    prompt needs its first step finished by the kill; a cancel, a running workflow)."""
    records = [o.person for r in results for o in r.outcomes if o.person is not None]
    drawn = [o.plan.person for r in results for o in r.outcomes if o.plan.person is not None]

    def count(kind: str) -> str:
        done = sum(1 for p in records if p.person.kind == kind and p.done)
        return f"{done} of {sum(1 for p in drawn if p.kind == kind)}"

    return (
        f"people: changed prompts tried {count('changed-prompt')} drawn, "
        f"cancels then resumes {count('cancel-resume')} drawn"
    )


def violation_line(result: ScheduleResult) -> str:
    """Everything needed to understand and replay a violating schedule, on one line."""
    schedule, findings = result.schedule, result.findings
    counts = ", ".join(f"{c} {findings.count(c)}" for c in CATEGORIES if findings.count(c))
    details = "; ".join(v.detail for v in findings.violations[:DETAILS])
    more = len(findings.violations) - DETAILS
    runs = "; ".join(o.describe() for o in result.outcomes)
    notes = f" | notes: {'; '.join(result.notes)}" if result.notes else ""
    return redact(
        f"VIOLATION {schedule.name} variant={schedule.variant}: {counts} "
        f"[{details}{f'; +{more} more' if more > 0 else ''}] | {schedule.describe()} "
        f"| {runs}{notes} | replay: {schedule.replay()}",
        result.token,
    )


def redact(line: str, token: str) -> str:
    """A run's last words may quote anything: the campaign's own output never holds a token."""
    return line.replace(token, "<session token>") if token else line


def error_line(result: ScheduleResult) -> str:
    last = (result.error or "").strip().splitlines()[-1:]
    return redact(
        f"HARNESS ERROR {result.schedule.name} variant={result.schedule.variant}: "
        f"{last[0] if last else '?'} | replay: {result.schedule.replay()}",
        result.token,
    )


def progress_line(done: int, total: int, result: ScheduleResult) -> str:
    findings = result.findings
    state = (
        "error"
        if result.error
        else (
            ", ".join(f"{c} {findings.count(c)}" for c in CATEGORIES if findings.count(c)) or "ok"
        )
    )
    people = "".join(
        f" | {o.plan.workflow_id} {o.person.describe()}"
        for o in result.outcomes
        if o.person is not None
    )
    return (
        f"[{done}/{total}] {result.schedule.name} {result.schedule.variant} "
        f"{result.seconds:.1f}s: {state} (late {findings.late}, cut short {findings.cut_short})"
        f"{people}"
    )


def timing_line(results: Sequence[ScheduleResult], wall: float, parallel: int) -> str:
    return (
        f"timing: {len(results)} schedules in {wall:.0f}s wall at --parallel {parallel}: "
        f"{wall / max(1, len(results)):.1f}s per schedule; {took([r.seconds for r in results])}"
    )
