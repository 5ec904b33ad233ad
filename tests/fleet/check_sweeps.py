"""The sweep keeps running: no stretch of scheduled sweeps all refused for a slot.

``orphan-sweep`` runs one at a time (a deployment concurrency limit of 1, new runs
cancelled on collision). A sweep run that holds the slot and never ends (its
host killed while it was submitted or running) refuses every sweep after it,
and with them every relaunch and every orphan retired. Judged over the schedule:
``STRETCH`` sweeps in a row cancelled for the limit (more than a minute) while the
run that held the slot had its host killed or cut off is a violation, naming that
run and the fault; a stretch behind a sweep that was merely slow (a cold start on
loaded cores) is reported as a figure.
"""

from __future__ import annotations

from datetime import datetime

from prefect.client.schemas.objects import FlowRun, StateType

from .evidence import Evidence
from .verdicts import Findings

#: Refusals in a row that one slow sweep (a cold start on loaded cores) does not explain.
STRETCH = 4
REFUSED = "concurrency limit"
#: Faults that leave a sweep on the host holding its slot without getting anywhere.
HOLDING = frozenset({"kill-host", "cut-host", "cut-store"})
SLACK = 5.0


def check_sweeps(ev: Evidence) -> Findings:
    findings = Findings()
    stretch = _longest_refusal(ev)
    if len(stretch) < STRETCH:
        return findings
    holder = _holder(ev, stretch[0])
    told = (
        f"{len(stretch)} scheduled sweeps in a row were cancelled ('Deployment concurrency "
        f"limit reached'), the first due {stretch[0].expected_start_time:%H:%M:%S}; the slot "
        f"was held by {_describe(ev, holder)}"
    )
    fault = _fault_on(ev, holder, stretch)
    if fault is not None:
        findings.add("sweep blocked", f"{told}, whose host was hit by {fault}")
    else:
        # A slow sweep (a cold start on loaded cores) holds the slot as long as it runs.
        findings.figures.append(f"{told}, on a host no fault touched")
    return findings


def _fault_on(ev: Evidence, holder: FlowRun | None, stretch: list[FlowRun]) -> str | None:
    """The fault that hit the holder's host after the holder took the slot and before
    the last refusal, if any (a killed sweep holds the slot well after its host is back)."""
    began = _began(holder) if holder is not None else None
    last = stretch[-1].expected_start_time
    if holder is None or began is None or last is None:
        return None
    host = ev.host_of(str(holder.id))
    for record in ev.played.faults:
        if (
            record.host == host
            and record.fault.kind in HOLDING
            and record.started is not None
            and began.timestamp() - SLACK <= record.started <= last.timestamp()
        ):
            return record.describe()
    return None


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


def _holder(ev: Evidence, refused: FlowRun) -> FlowRun | None:
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
    return holding[-1] if holding else None


def _describe(ev: Evidence, holder: FlowRun | None) -> str:
    if holder is None:
        return "no sweep run unfinished at the time (the slot leaked)"
    ended = f"ended {holder.end_time:%H:%M:%S}" if holder.end_time else "never ended"
    state = holder.state_type.value if holder.state_type else "?"
    return (
        f"sweep run {holder.name} ({holder.id}) on {ev.host_of(str(holder.id))}, due "
        f"{holder.expected_start_time:%H:%M:%S}, {ended}, {state}/{holder.state_name}"
    )
