"""Checks for any workflow's end, and for one a user's own flow ran.

``durable_chat`` returns every step's result; a user's own flow returns what it
likes (``refund_order``: its last turn's text). Its steps' results are read from
the store instead, where a finished step's result is written with its checkpoint,
and checked against the chat like ``durable_chat``'s; what the flow returned must
be its last turn's. For every workflow: an effect no step of the plan asked for
(a refund after the person declined) is a violation, and the chat of a completed
workflow is archived by the run that completed it, not left to the sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coder_chat.durable.step import StepResult
from coder_chat.durable.store import DurableStore
from coder_chat.simulator import Simulator
from prefect_coder.payments import Ledger
from tests.lab.steps import WorkflowPlan
from tests.lab.verdicts import Findings

from .charges import logical_calls
from .drive import WorkflowOutcome


async def stored_results(
    store: DurableStore, tenant: str, workflow_id: str
) -> list[dict[str, Any]]:
    """Every finished step's result as the store holds it, in ``durable_chat``'s shape."""
    steps = await store.list_steps(tenant, workflow_id)
    return [StepResult.from_record(s, s.verdict).model_dump(mode="json") for s in steps]


def check_returned(outcome: WorkflowOutcome) -> Findings:
    """A refund flow returns its last turn's text: the last stored step's."""
    findings = Findings()
    if outcome.returned is None or not outcome.results:
        return findings  # a workflow no run completed is reported as lost results
    last = outcome.results[-1].get("text")
    if outcome.returned.value != last:
        findings.add(
            "lost results",
            f"{outcome.plan.workflow_id}: the flow returned {str(outcome.returned.value)[:80]!r}, "
            f"not its last stored step's text {str(last)[:80]!r}",
        )
    return findings


def check_unplanned(sim: Simulator, payments: Ledger, plans: Sequence[WorkflowPlan]) -> Findings:
    """Every applied effect belongs to a step that asked for it, with its amount."""
    planned = {
        (plan.workflow_id, number, amount)
        for plan in plans
        for number, step in enumerate(plan.steps, start=1)
        for amount in step.amounts
    }
    findings = Findings()
    for (workflow_id, step, amount), keys in sorted(logical_calls(sim, payments).items(), key=str):
        if (workflow_id, step, amount) not in planned:
            findings.add(
                "unwanted effects",
                f"{workflow_id} step {step}: {amount} cents applied ({len(keys)} key(s)), "
                "which no step of the workflow asked for",
            )
    return findings


def check_archived_at_end(outcome: WorkflowOutcome, archived: set[str]) -> Findings:
    """The chat of a completed workflow was archived when it ended (before any sweep)."""
    findings = Findings()
    if outcome.returned is None or not outcome.results:
        return findings
    for chat_id in sorted({str(r["chat_id"]) for r in outcome.results}):
        if chat_id not in archived:
            findings.add(
                "live orphans",
                f"{outcome.plan.workflow_id}: chat {chat_id} was left unarchived when the "
                "workflow completed",
            )
    return findings
