"""A violating schedule's story, written to ``timeline.txt`` in its folder.

Everything the checks judged, in the order the server saw it: the runs and their
kills, each chat's committed messages, accepted interrupts, tool results, the
charges, so a violation can be understood without replaying it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from coder_chat.simulator.state import Message
from tests.lab.truth import workflow_chats
from tests.lab.verdicts import Findings

from .arena import Arena
from .drive import WorkflowOutcome


def write_timeline(arena: Arena, outcomes: list[WorkflowOutcome], findings: Findings) -> None:
    lines = [arena.schedule.describe(), f"replay: {arena.schedule.replay()}", ""]
    lines += [f"violation: {v.category}: {v.detail}" for v in findings.violations]
    lines += [o.describe() for o in outcomes]
    lines += [f"in flight at a kill: {r}" for o in outcomes for r in o.in_flight]
    lines += [f"note: {n}" for n in arena.notes]
    for outcome in outcomes:
        if outcome.person is not None:
            lines.append(f"{outcome.plan.workflow_id} {outcome.person.describe()}")
            lines += [f"  cancel: {line}" for line in outcome.person.lines]
    lines += [f"sweep: {line}" for line in arena.sweep_lines]
    origin = _origin(arena, outcomes)
    for outcome in outcomes:
        for chat in workflow_chats(arena.sim, outcome.plan.workflow_id):
            lines.append(f"\nchat {chat.id} [{chat.status}] archived={chat.archived}")
            lines += [_message(m, origin) for m in chat.visible_messages()]
    records = arena.sim.records
    lines.append("")
    lines += [
        f"interrupt {i.chat_id} +{_at(i.at, origin)} {i.http_status} (was {i.status_before})"
        for i in records.interrupts
    ]
    lines += [
        f"tool result {r.chat_id} +{_at(r.at, origin)} {r.tool_call_id} "
        f"{'synthetic ' if r.synthetic else ''}{str(r.output)[:80]}"
        for r in records.tool_results
    ]
    lines += [
        f"errors seen {c}: {[_at(t, origin) for t in ts]}"
        for c, ts in arena.statuses.errors.items()
    ]
    payments = arena.lab.payments
    lines += [
        f"charge {k}: applied {payments.applied.get(k, 0)}, requests {n}"
        for k, n in payments.requests.items()
    ]
    (arena.root / "timeline.txt").write_text("\n".join(lines) + "\n")


def _origin(arena: Arena, outcomes: list[WorkflowOutcome]) -> datetime | None:
    firsts = [c.created_at for o in outcomes for c in workflow_chats(arena.sim, o.plan.workflow_id)]
    return min(firsts) if firsts else None


def _at(moment: datetime, origin: datetime | None) -> str:
    return f"{(moment - origin).total_seconds():.3f}s" if origin else moment.isoformat()


def _message(message: Message, origin: datetime | None) -> str:
    parts: list[str] = []
    for part in message.content:
        kind: Any = part.get("type")
        if kind == "text":
            parts.append(repr(str(part.get("text", ""))[:140]))
        elif kind == "tool-call":
            parts.append(
                f"call {part.get('tool_name')} {part.get('tool_call_id')} {part.get('args')}"
            )
        else:
            parts.append(
                f"{kind} {part.get('tool_call_id', '')} {str(part.get('result', ''))[:60]}"
            )
    return f"  {message.id} +{_at(message.created_at, origin)} {message.role}: {' | '.join(parts)}"
