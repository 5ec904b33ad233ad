"""How long recovery took, beside what the lab's limits allow (measured, and judged).

For every fault that stopped a run's heartbeat (its host killed, cut off, or cut
off from the store), the run that held a workflow then, and the run that took
its next epoch: the successor must have been launched by the first sweep due
once the heartbeat went stale, that is within **stale-heartbeat limit + one
sweep interval** (plus a heartbeat and a few seconds of slack, plus any time
Prefect's server was down) of the fault, then the sweep's own time to get going
and act; and the workflow must have finished within that **plus the successor's
own work** (its flow run, from creation to end). A fault healed before the
heartbeat went stale may need no successor at all: then nothing is judged here.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from prefect.client.schemas.objects import FlowRun

from .evidence import Evidence
from .faults import FaultRecord
from .storelog import EpochTaken, epochs
from .verdicts import Findings

#: Faults after which a run's heartbeat stops reaching the store.
SILENCING = frozenset({"kill-host", "cut-host", "cut-store"})
SLACK = 5.0


def check_recovery(ev: Evidence) -> Findings:
    findings = Findings()
    for record in ev.played.faults:
        if record.fault.kind not in SILENCING or record.started is None:
            continue
        for wf in ev.workflow_ids:
            taken = epochs(ev.writes, wf)
            hit = _held_at(taken, record)
            if hit is not None:
                findings.merge(_judge(ev, wf, record, hit, taken))
    return findings


def _held_at(taken: list[EpochTaken], record: FaultRecord) -> EpochTaken | None:
    """The epoch the fault's host held for the workflow when the fault began."""
    assert record.started is not None
    before = [t for t in taken if t.at.timestamp() <= record.started]
    held = before[-1] if before else None
    return held if held is not None and held.flow_run_id in record.runs else None


def _judge(
    ev: Evidence, wf: str, record: FaultRecord, hit: EpochTaken, taken: list[EpochTaken]
) -> Findings:
    findings = Findings()
    after = [t for t in taken if t.epoch > hit.epoch]
    successor = _run(ev, wf, after[0].flow_run_id) if after else None
    assert record.started is not None
    fault_at = datetime.fromtimestamp(record.started, tz=hit.at.tzinfo)
    finished = _finished_at(ev, wf)
    if successor is None or successor.created is None:
        healed = (
            record.ended is not None and record.ended - record.started < ev.timings.stale_heartbeat
        )
        if not healed and finished is None:
            findings.add("slow recovery", f"{wf}: no run took over after {record.describe()}")
        return findings
    sweep = _relauncher(ev, successor)
    sweep_own = (
        (successor.created - sweep.expected_start_time).total_seconds()
        if sweep and sweep.expected_start_time
        else 0.0
    )
    limit = _limit(ev, record) + max(0.0, sweep_own)
    took = (successor.created - fault_at).total_seconds()
    own = _own_work(successor)
    total = (finished - fault_at).total_seconds() if finished else None
    findings.figures.append(
        f"{wf}: {record.fault.kind} on {record.host}: relaunched {took:.1f}s after the fault "
        f"(allowed {limit:.1f}s, of which the sweep's own {sweep_own:.1f}s); finished "
        + (
            f"{total:.1f}s after it (allowed {limit + own + SLACK:.1f}s, of which the successor's own work {own:.1f}s)"
            if total is not None
            else "never"
        )
    )
    if took > limit:
        findings.add(
            "slow recovery",
            f"{wf}: relaunched {took:.1f}s after {record.describe()}, allowed {limit:.1f}s",
        )
    elif total is not None and total > limit + own + SLACK and not _hit_again(ev, successor):
        findings.add(
            "slow recovery",
            f"{wf}: finished {total:.1f}s after {record.describe()}, allowed {limit + own + SLACK:.1f}s",
        )
    return findings


def _limit(ev: Evidence, record: FaultRecord) -> float:
    t = ev.timings
    down = sum(
        (r.ended or 0) - (r.started or 0)
        for r in ev.played.faults
        if r.fault.kind == "restart-prefect" and r.started and r.ended
    )
    return t.stale_heartbeat + t.sweep_interval + t.heartbeat + SLACK + down


def _run(ev: Evidence, wf: str, run_id: str) -> FlowRun | None:
    return next((r for r in ev.runs[wf] if str(r.id) == run_id), None)


def _relauncher(ev: Evidence, successor: FlowRun) -> FlowRun | None:
    """The sweep run that was running when the successor was created."""
    created = successor.created
    assert created is not None
    return next(
        (
            s
            for s in ev.sweeps
            if s.start_time is not None
            and s.start_time <= created
            and (s.end_time is None or created <= s.end_time + timedelta(seconds=1))
        ),
        None,
    )


def _own_work(run: FlowRun) -> float:
    if run.created is None or run.end_time is None:
        return 0.0
    return float((run.end_time - run.created).total_seconds())


def _finished_at(ev: Evidence, wf: str) -> datetime | None:
    for write in ev.writes:
        if (
            write.table == "workflows"
            and write.params.get(2) == wf
            and write.params.get(4) == "finished"
        ):
            return write.committed
    return None


def _hit_again(ev: Evidence, run: FlowRun) -> bool:
    return any(str(run.id) in r.runs for r in ev.played.faults)
