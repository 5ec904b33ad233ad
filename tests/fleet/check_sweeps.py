"""The sweep keeps running: no stretch of scheduled sweeps all refused for a slot.

``orphan-sweep`` runs one at a time (a deployment concurrency limit of 1, new runs
cancelled on collision). A sweep run that holds the slot and never ends (its
host killed while it was submitted or running) refuses every sweep after it,
and with them every relaunch and every orphan retired. Judged over the schedule:
``STRETCH`` sweeps in a row cancelled for the limit (more than a minute) is a
violation, naming the run that held the slot.
"""

from __future__ import annotations

from prefect.client.schemas.objects import FlowRun, StateType

from .evidence import Evidence
from .verdicts import Findings

#: Refusals in a row that one slow sweep (a cold start on loaded cores) does not explain.
STRETCH = 4
REFUSED = "concurrency limit"


def check_sweeps(ev: Evidence) -> Findings:
    findings = Findings()
    end = ev.played.all_ended or max(
        (s.expected_start_time for s in ev.sweeps if s.expected_start_time), default=None
    )
    due = [
        s
        for s in ev.sweeps
        if s.expected_start_time is not None
        and s.expected_start_time >= ev.played.started
        and (end is None or s.expected_start_time <= end)
        and s.state_type != StateType.SCHEDULED
    ]
    run, longest = 0, 0
    for sweep in due:
        run = run + 1 if _refused(sweep) else 0
        longest = max(longest, run)
    if longest >= STRETCH:
        holder = _holder(ev, due)
        findings.add(
            "sweep blocked",
            f"{longest} scheduled sweeps in a row were cancelled ('Deployment concurrency "
            f"limit reached'); the slot was held by {holder}",
        )
    return findings


def _refused(sweep: FlowRun) -> bool:
    state = sweep.state
    return (
        state is not None and state.type == StateType.CANCELLED and REFUSED in (state.message or "")
    )


def _holder(ev: Evidence, due: list[FlowRun]) -> str:
    """The sweep run that was unfinished when the first refusal came: it held the slot."""
    first = next((s for s in due if _refused(s)), None)
    refused_at = first.start_time or first.expected_start_time if first else None
    if refused_at is None:
        return "?"
    holding = [
        s
        for s in ev.sweeps
        if not _refused(s)
        and s.state_type != StateType.SCHEDULED
        and (began := s.start_time or s.expected_start_time) is not None
        and began <= refused_at
        and (s.end_time is None or s.end_time >= refused_at)
    ]
    if not holding:
        return "no sweep run unfinished at the time (the slot leaked)"
    s = holding[-1]
    ended = f"until {s.end_time:%H:%M:%S}" if s.end_time else "never ended"
    return (
        f"sweep run {s.name} ({s.id}) on {ev.host_of(str(s.id))}, started "
        f"{s.start_time or s.expected_start_time:%H:%M:%S}, {ended} ({s.state_name})"
    )
