"""How long recovery took, beside what the lab's limits allow (measured, and judged).

For every fault that stopped a run's heartbeat (its host killed, cut off, or cut
off from the store), take the run that held a workflow then, and the run that
took its next epoch. The successor must have been launched by the first sweep
due once the heartbeat went stale: within **stale-heartbeat limit + one sweep
interval** of the fault (plus a heartbeat and a few seconds of slack, plus any
time Prefect's server was down), and then the sweep's own time to start and act.
A sweep pass lost with the host holds no more: its lease is shorter than an
interval (``Timings.sweep_lease``), so the next pass due takes over.
The workflow must have finished within that **plus the successor's own work**
(its flow run, from creation to end). An outage that outlasted all of that with
no successor launched at all is a violation too; one healed sooner may need no
successor, and then nothing is judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from prefect.client.schemas.objects import FlowRun

from .evidence import Evidence
from .faults import FaultRecord
from .storelog import EpochTaken, ended, epochs
from .verdicts import Findings

#: Faults after which a run's heartbeat stops reaching the store.
SILENCING = frozenset({"kill-host", "cut-host", "cut-store"})
SLACK = 5.0
#: A sweep's own time to start and act, when no relaunch measured it (a cold Python,
#: Prefect's imports, on two loaded cores).
SWEEP_START = 30.0


@dataclass(frozen=True)
class Hit:
    """One workflow whose holder a fault silenced."""

    workflow_id: str
    record: FaultRecord
    held: EpochTaken
    at: datetime


def check_recovery(ev: Evidence) -> Findings:
    findings = Findings()
    for record in ev.played.faults:
        if record.fault.kind in SILENCING and record.started is not None:
            for wf in ev.workflow_ids:
                hit = _hit(ev, wf, record)
                if hit is not None:
                    findings.merge(_judge(ev, hit))
    return findings


def _hit(ev: Evidence, wf: str, record: FaultRecord) -> Hit | None:
    """The epoch the fault's host held for the workflow when the fault began, if any."""
    assert record.started is not None
    before = [t for t in epochs(ev.writes, wf) if t.at.timestamp() <= record.started]
    end = ended(ev.writes, wf)
    if not before or before[-1].flow_run_id not in record.runs:
        return None
    if end is not None and end.at.timestamp() <= record.started:
        return None
    return Hit(wf, record, before[-1], datetime.fromtimestamp(record.started, before[-1].at.tzinfo))


def _judge(ev: Evidence, hit: Hit) -> Findings:
    if (cancelled := _cancelled_after(ev, hit)) is not None:
        findings = Findings()
        findings.figures.append(
            f"{hit.workflow_id}: recovery after {hit.record.fault.kind} on {hit.record.host} "
            f"not judged: a person cancelled the workflow ({cancelled:+.1f}s from it)"
        )
        return findings
    after = [t for t in epochs(ev.writes, hit.workflow_id) if t.epoch > hit.held.epoch]
    successor = _run(ev, hit.workflow_id, after[0].flow_run_id) if after else None
    if successor is None or successor.created is None:
        return _no_successor(ev, hit)
    findings = Findings()
    sweep_own = _sweep_own(ev, successor)
    limit = _limit(ev) + sweep_own + _lost_relaunches(ev, hit, successor)
    took = (successor.created - hit.at).total_seconds()
    own = _own_work(successor)
    finished = _finished_at(ev, hit.workflow_id)
    total = (finished - hit.at).total_seconds() if finished else None
    what = f"{hit.record.fault.kind} on {hit.record.host}"
    told = (
        f"{total:.1f}s after it (allowed {limit + own + SLACK:.1f}s, of which the "
        f"successor's own work {own:.1f}s)"
        if total is not None
        else "never"
    )
    findings.recoveries.append((hit.record.fault.kind, took, total))
    findings.figures.append(
        f"{hit.workflow_id}: {what}: relaunched {took:.1f}s after the fault (allowed "
        f"{limit:.1f}s, of which the sweep's own {sweep_own:.1f}s); finished {told}"
    )
    if took > limit:
        findings.add(
            "slow recovery",
            f"{hit.workflow_id}: relaunched {took:.1f}s after {what}, allowed {limit:.1f}s",
        )
    elif total is not None and total > limit + own + SLACK and not _hit_again(ev, successor):
        findings.add(
            "slow recovery",
            f"{hit.workflow_id}: finished {total:.1f}s after {what}, allowed {limit + own + SLACK:.1f}s",
        )
    return findings


def _cancelled_after(ev: Evidence, hit: Hit) -> float | None:
    """Seconds from the fault to a person's cancel of the workflow (negative: the cancel
    came first), if the fault came before the person's resume took the workflow over:
    it then waits for the person, not for the sweep."""
    for person in ev.played.people:
        at = person.acted_at
        if person.workflow_id != hit.workflow_id or not person.done or at is None:
            continue
        if person.person.kind != "cancel-resume":
            continue
        resumed = [
            t for t in epochs(ev.writes, hit.workflow_id) if t.flow_run_id == person.resumed_run
        ]
        if not resumed or hit.at < resumed[0].at:
            return (at - hit.at).total_seconds()
    return None


def _lost_relaunches(ev: Evidence, hit: Hit, successor: FlowRun) -> float:
    """The wait for a relaunch that never began (it landed on a host cut off from the
    store, say): the sweep makes another once it is ``relaunch_start`` old, at its next
    pass. Allowed only when the successor was such a second relaunch."""
    made = [
        r
        for r in ev.runs[hit.workflow_id]
        if r.created is not None
        and successor.created is not None
        and hit.at < r.created < successor.created
    ]
    t = ev.timings
    return len(made) * (t.relaunch_start + t.sweep_interval)


def _no_successor(ev: Evidence, hit: Hit) -> Findings:
    """No run took over: fine if the outage ended before one was due, else a violation."""
    findings = Findings()
    record = hit.record
    assert record.started is not None
    lasted = (record.ended or record.started) - record.started
    relaunched = [
        r for r in ev.runs[hit.workflow_id] if r.created is not None and r.created > hit.at
    ]
    # A relaunch made, but on a host the same fault cut off, is waited for that long more.
    extra = ev.timings.relaunch_start + ev.timings.sweep_interval if relaunched else 0.0
    allowed = _limit(ev) + SWEEP_START + extra
    if lasted > allowed:
        findings.add(
            "slow recovery",
            f"{hit.workflow_id}: no run took over during the {lasted:.0f}s of "
            f"{record.fault.kind} on {record.host} (one was due within {allowed:.0f}s); "
            f"{_sweeps_during(ev, record)}",
        )
    return findings


def _sweeps_during(ev: Evidence, record: FaultRecord) -> str:
    """What the sweep runs due during the outage became, counted by their end state."""
    assert record.started is not None
    start = datetime.fromtimestamp(record.started).astimezone()
    end = datetime.fromtimestamp(record.ended or record.started).astimezone()
    counts: dict[str, int] = {}
    for sweep in ev.sweeps:
        due = sweep.expected_start_time
        if due is not None and start <= due <= end:
            state = sweep.state
            said = f"{state.name}: {(state.message or '')[:60]}" if state else "no state"
            counts[said] = counts.get(said, 0) + 1
    told = "; ".join(f"{n}x {said}" for said, n in counts.items())
    return f"sweeps due meanwhile: {told or 'none'}"


def _limit(ev: Evidence) -> float:
    t = ev.timings
    down = sum(
        (r.ended or 0) - (r.started or 0)
        for r in ev.played.faults
        if r.fault.kind == "restart-prefect" and r.started and r.ended
    )
    return t.sweep.stale_heartbeat + t.sweep_interval + t.heartbeat + SLACK + down


def _run(ev: Evidence, wf: str, run_id: str) -> FlowRun | None:
    return next((r for r in ev.runs[wf] if str(r.id) == run_id), None)


def _sweep_own(ev: Evidence, successor: FlowRun) -> float:
    """From the relaunching sweep's due time to the relaunch: its own start and work."""
    created = successor.created
    assert created is not None
    sweep = next(
        (
            s
            for s in ev.sweeps
            if s.start_time is not None
            and s.start_time <= created
            and (s.end_time is None or created <= s.end_time + timedelta(seconds=1))
        ),
        None,
    )
    if sweep is None or sweep.expected_start_time is None:
        return 0.0
    return max(0.0, float((created - sweep.expected_start_time).total_seconds()))


def _own_work(run: FlowRun) -> float:
    if run.created is None or run.end_time is None:
        return 0.0
    return float((run.end_time - run.created).total_seconds())


def _finished_at(ev: Evidence, wf: str) -> datetime | None:
    end = ended(ev.writes, wf)
    return end.at if end is not None and end.state == "finished" else None


def _hit_again(ev: Evidence, run: FlowRun) -> bool:
    return any(str(run.id) in r.runs for r in ev.played.faults)
