"""Every invariant of one schedule, checked against ground truth once it has ended."""

from __future__ import annotations

from coder_chat.durable.markers import LABEL_WORKFLOW
from coder_chat.durable.records import WorkflowState
from coder_chat.simulator import Simulator
from tests.lab.leaks import leaking
from tests.lab.verdicts import Findings

from .arena import Arena
from .charges import check_charges
from .drive import WorkflowOutcome
from .leaks import schedule_places
from .own_flows import check_archived_at_end, check_returned, check_unplanned, stored_results
from .resends import check_resends
from .results import check_results
from .usage import check_usage


async def check_schedule(arena: Arena, outcomes: list[WorkflowOutcome]) -> Findings:
    sim, payments = arena.sim, arena.lab.payments
    findings = check_charges(sim, payments)
    findings.merge(check_unplanned(sim, payments, [o.plan for o in outcomes]))
    for outcome in outcomes:
        if outcome.plan.refund is not None and outcome.returned is not None:
            wf = outcome.plan.workflow_id
            outcome.results = await stored_results(arena.store, arena.tenant, wf)
            findings.merge(check_returned(outcome))
        findings.merge(check_results(sim, payments, outcome, arena.statuses))
        findings.merge(check_resends(sim, outcome, arena.statuses))
        findings.merge(check_archived_at_end(outcome, arena.archived_before_sweep))
        findings.merge(await check_person(arena, outcome))
        wf = outcome.plan.workflow_id
        findings.merge(await check_usage(sim, arena.store, arena.tenant, wf))
    findings.merge(check_orphans(arena.sim, [o.plan.workflow_id for o in outcomes]))
    findings.merge(check_leaks(await schedule_places(arena), arena.sim.token))
    return findings


async def check_person(arena: Arena, outcome: WorkflowOutcome) -> Findings:
    """What the person's action found when it was taken; and a cancelled workflow that a
    resume completed is stored finished, not left cancelled."""
    record = outcome.person
    if record is None:
        return Findings()
    findings = Findings()
    findings.merge(record.findings)
    if record.person.kind == "cancel-resume" and record.done and outcome.results is not None:
        wf = outcome.plan.workflow_id
        stored = await arena.store.get_workflow(arena.tenant, wf)
        if stored is None or stored.state != WorkflowState.FINISHED:
            state = stored.state if stored else "nothing"
            findings.add(
                "people's actions",
                f"{wf} {record.person.describe()}: resumed to its end, the store says {state}",
            )
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
