"""Every invariant of one schedule, checked against ground truth once it has ended."""

from __future__ import annotations

from coder_chat.durable.markers import LABEL_WORKFLOW
from coder_chat.simulator import Simulator

from .arena import Arena
from .charges import check_charges
from .drive import WorkflowOutcome
from .leaks import leaking, schedule_places
from .resends import check_resends
from .results import check_results
from .verdicts import Findings


async def check_schedule(arena: Arena, outcomes: list[WorkflowOutcome]) -> Findings:
    findings = check_charges(arena.sim, arena.lab.payments)
    for outcome in outcomes:
        findings.merge(check_results(arena.sim, arena.lab.payments, outcome, arena.statuses))
        findings.merge(check_resends(arena.sim, outcome, arena.statuses))
    findings.merge(check_orphans(arena.sim, [o.plan.workflow_id for o in outcomes]))
    findings.merge(check_leaks(await schedule_places(arena), arena.sim.token))
    return findings


def check_orphans(sim: Simulator, workflow_ids: list[str]) -> Findings:
    """After the sweep, no chat of these workflows may be left unarchived."""
    findings = Findings()
    for chat in sim.chats():
        workflow_id = chat.labels.get(LABEL_WORKFLOW)
        if workflow_id in workflow_ids and not chat.archived:
            findings.add(
                "live orphans", f"{workflow_id}: chat {chat.id} [{chat.status}] unarchived"
            )
    return findings


def check_leaks(places: dict[str, bytes], token: str) -> Findings:
    findings = Findings()
    for place in leaking(places, token):
        findings.add("token leaks", f"the session token is in {place}")
    return findings
