"""The sweep keeps running: no stretch of scheduled sweeps all refused for a slot.

``orphan-sweep`` runs one at a time (a deployment concurrency limit of 1, new runs
cancelled on collision). A sweep run that holds the slot and never ends (its
host killed while it was submitted or running) refuses every sweep after it,
and with them every relaunch and every orphan retired. Judged over the schedule:
``STRETCH`` sweeps in a row cancelled for the limit (more than a minute) is a
violation, naming the run that held the slot.
"""

from __future__ import annotations

from datetime import datetime

from prefect.client.schemas.objects import FlowRun, StateType

from .evidence import Evidence
from .verdicts import Findings

#: Refusals in a row that one slow sweep (a cold start on loaded cores) does not explain.
STRETCH = 4
REFUSED = "concurrency limit"


def check_sweeps(ev: Evidence) -> Findings:
    findings = Findings()
    stretch = _longest_refusal(ev)
    if len(stretch) >= STRETCH:
        findings.add(
            "sweep blocked",
            f"{len(stretch)} scheduled sweeps in a row were cancelled ('Deployment concurrency "
            f"limit reached'), the first due {stretch[0].expected_start_time:%H:%M:%S}; the slot "
            f"was held by {_holder(ev, stretch[0])}",
        )
    return findings


def _longest_refusal(ev: Evidence) -> list[FlowRun]:
    """The longest run of consecutive refused sweeps due during the schedule's work."""
    end = ev.played.all_ended
    due = [
        s
        for s in ev.sweeps
        if s.expected_start_time is not None
        and s.expected_start_time >= ev.played.started
        and (end is None or s.expected_start_time <= end)
        and s.state_type != StateType.SCHEDULED
    ]
    longest: list[FlowRun] = []
    current: list[FlowRun] = []
    for sweep in due:
        current = [*current, sweep] if _refused(sweep) else []
        longest = current if len(current) > len(longest) else longest
    return longest


def _refused(sweep: FlowRun) -> bool:
    state = sweep.state
    return (
        state is not None and state.type == StateType.CANCELLED and REFUSED in (state.message or "")
    )


def _began(sweep: FlowRun) -> datetime | None:
    """When a sweep could first have held the slot (a run marked crashed without ever
    starting gets its start time then, long after it took the slot)."""
    times = [t for t in (sweep.expected_start_time, sweep.start_time) if t is not None]
    return min(times, default=None)


def _holder(ev: Evidence, refused: FlowRun) -> str:
    """The sweep run that was unfinished when ``refused`` was refused: it held the slot."""
    at = refused.start_time or refused.expected_start_time
    assert at is not None
    holding = [
        s
        for s in ev.sweeps
        if not _refused(s)
        and s.state_type != StateType.SCHEDULED
        and (began := _began(s)) is not None
        and began <= at
        and (s.end_time is None or s.end_time >= at)
    ]
    if not holding:
        return "no sweep run unfinished at the time (the slot leaked)"
    s = holding[-1]
    ended = f"ended {s.end_time:%H:%M:%S}" if s.end_time else "never ended"
    return (
        f"sweep run {s.name} ({s.id}), last seen on {ev.host_of(str(s.id))}, due "
        f"{s.expected_start_time:%H:%M:%S}, {ended}, {s.state_type.value if s.state_type else '?'}"
        f"/{s.state_name}"
    )
