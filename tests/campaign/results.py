"""Did the run that completed each workflow return every step's result, as committed?

A step's result must equal the server's answer to the step's last attempt (or to one
of the whole attempts a duplicate followed, see :func:`answered`), be non-empty,
carry each of its charges' receipts, and, for a structured step, the validated
object. A workflow no run completed has lost every step's result.
"""

from __future__ import annotations

from typing import Any

from prefect.utilities.importtools import import_object

from coder_chat.simulator import Simulator
from coder_chat.simulator.state import Message
from prefect_coder.payments import Ledger
from tests.lab.schemas import Verdict
from tests.lab.steps import Step
from tests.lab.truth import StatusLog, attempts, reply_to
from tests.lab.verdicts import Findings, Pair

from .charges import receipt_for
from .drive import WorkflowOutcome
from .resends import classify


def check_results(
    sim: Simulator, payments: Ledger, outcome: WorkflowOutcome, statuses: StatusLog
) -> Findings:
    findings = Findings()
    wf, steps = outcome.plan.workflow_id, outcome.plan.steps
    if outcome.results is None:
        last = outcome.runs[-1].describe() if outcome.runs else "no run"
        findings.add("lost results", f"{wf} step 1: no run completed the workflow ({last})")
        for number in range(2, len(steps) + 1):
            findings.add("lost results", f"{wf} step {number}: lost with it")
        return findings
    returned = {int(r["step"]): r for r in outcome.results}
    for number, step in enumerate(steps, start=1):
        result = returned.get(number)
        problems = step_problems(sim, payments, outcome, statuses, number, step, result)
        for problem in problems:
            findings.add("lost results", f"{wf} step {number}: {problem}")
    return findings


def step_problems(
    sim: Simulator,
    payments: Ledger,
    outcome: WorkflowOutcome,
    statuses: StatusLog,
    number: int,
    step: Step,
    result: dict[str, Any] | None,
) -> list[str]:
    wf = outcome.plan.workflow_id
    if result is None:
        return ["no result returned"]
    tries = attempts(sim, wf, number)
    if not tries:
        return ["a result returned for a step never submitted"]
    text, problems = str(result.get("text", "")), []
    if not text:
        problems.append("an empty result")
    kinds = classify(sim, outcome, statuses, number, tries)
    if text not in {reply_to(sim, t) for t in answered(kinds, tries)}:
        problems.append(f"the result {text[:80]!r} is not the committed answer")
    for amount in step.amounts:
        receipt = receipt_for(sim, payments, wf, number, amount)
        if receipt is None:
            problems.append(f"the charge of {amount} cents was never applied")
        elif step.receipt_line(amount, receipt) not in text:
            problems.append(f"the result lacks the receipt of {amount} cents")
    if step.structured is not None:
        model = import_object(step.schema) if step.schema else Verdict
        expected = model.model_validate(step.structured).model_dump(mode="json")
        if result.get("output") != expected:
            problems.append(f"structured output {result.get('output')!r} != {expected!r}")
    return problems


def answered(kinds: list[Pair], tries: list[Message]) -> list[Message]:
    """The attempts whose answer the result may be: those after the last attempt that
    was cut short (a late or resent duplicate is a whole answer too; the resends check
    reports it)."""
    valid = tries[:1]
    for kind, later in zip(kinds, tries[1:], strict=True):
        valid = [later] if kind == "cut short" else [*valid, later]
    return valid
