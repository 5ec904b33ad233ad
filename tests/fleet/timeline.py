"""A schedule's story, as ``timeline.txt`` in its folder: what happened, in the order it did.

Times are seconds since the schedule began. It names the faults and the runs they
hit, each workflow's epochs (which run took which, from which host), each flow
run's end state, every action that reached Coder on the workflow's chats (and who
sent it), the chats' messages, and what the checks found.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from .evidence import Evidence
from .faults import FaultRecord
from .storelog import epochs
from .verdicts import Findings


def write_timeline(ev: Evidence, findings: Findings, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(timeline(ev, findings)) + "\n")


def timeline(ev: Evidence, findings: Findings) -> list[str]:
    schedule, origin = ev.played.schedule, ev.played.started
    lines = [schedule.describe(), f"replay: {schedule.replay()}", ""]
    lines += [f"VIOLATION {v.category}: {v.detail}" for v in findings.violations]
    lines += [f"figure: {f}" for f in findings.figures]
    lines += [f"unattributed: {u}" for u in findings.unattributed]
    lines += [f"note: {n}" for n in ev.played.notes]
    lines += ["", "faults:"] + [f"  {_fault(r, origin)}" for r in ev.played.faults]
    lines += ["", "sweeps:"] + [
        f"  due {_at(s.expected_start_time, origin)} {s.name} on {ev.host_of(str(s.id))}: "
        f"{s.state_type.value if s.state_type else '-'}/{s.state_name} "
        f"{((s.state.message if s.state else '') or '')[:100]}"
        for s in ev.sweeps
        if s.expected_start_time
        and s.expected_start_time >= origin
        and s.state_type
        and s.state_type.value != "SCHEDULED"
    ]
    for wf in ev.workflow_ids:
        lines += ["", f"workflow {wf}:", *_workflow(ev, wf, origin)]
    return lines


def _fault(record: FaultRecord, origin: datetime) -> str:
    start = f"+{record.started - origin.timestamp():.1f}s" if record.started else "never"
    end = f"..+{record.ended - origin.timestamp():.1f}s" if record.ended else ""
    runs = f" runs hit {record.runs}" if record.runs else ""
    flying = f" in flight {[f.describe() for f in record.in_flight]}" if record.in_flight else ""
    note = f" [{record.note}]" if record.note else ""
    return f"{start}{end} {record.fault.describe()} on {record.host or '-'}{runs}{flying}{note}"


def _workflow(ev: Evidence, wf: str, origin: datetime) -> list[str]:
    lines = [
        f"  epoch {t.epoch} taken {_at(t.at, origin)} by {t.flow_run_id} "
        f"({ev.run_name(t.flow_run_id)}, on {ev.host_of(t.flow_run_id)}, from {t.src})"
        for t in epochs(ev.writes, wf)
    ]
    for run in ev.runs[wf]:
        state = run.state
        said = f"{state.type.value}/{state.name} {(state.message or '')[:200]}" if state else "-"
        lines.append(f"  run {run.name} {run.id} on {ev.host_of(str(run.id))}: {said}")
        lines += [f"    log {line[:240]}" for line in ev.logs.get(str(run.id), [])]
    chats = {c.id for c in ev.truth.workflow_chats(wf)}
    lines += [
        f"  {_at(r.at, origin)} {r.action} {r.path} by {r.flow_run_id or '?'} ({r.host or r.src})"
        for r in ev.requests
        if r.action and (r.chat_id in chats)
    ]
    lines += [
        f"  {_at(a.at, origin)} accepted {a.kind} {a.http_status} {a.tool_call_id}"
        f"{' synthetic' if a.synthetic else ''}"
        for a in (*ev.truth.interrupts, *ev.truth.tool_results, *ev.truth.archives)
        if a.chat_id in chats
    ]
    for chat in ev.truth.workflow_chats(wf):
        lines.append(f"  chat {chat.id} [{chat.status}] archived={chat.archived}")
        lines += [
            f"    {m.id} {_at(m.created_at, origin)} {m.role}: {m.text()[:120]!r}"
            for m in chat.messages
        ]
    return lines


def _at(moment: datetime, origin: datetime) -> str:
    return f"+{(moment - origin).total_seconds():.2f}s"
