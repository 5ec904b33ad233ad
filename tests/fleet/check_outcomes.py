"""Every workflow finished, with the right results, each effect once, no chat left live.

- **finished**: the store holds the workflow ``finished`` and one of its flow runs
  completed, or was cancelled by a person as the workflow finished (a workflow failed
  for good, or still running, is a violation; one in a schedule where Prefect's server
  was restarted says so).
- **results**: each step's stored answer (the store is the record of progress) is
  the server's committed answer to one of its whole attempts.
- **charges** (every effect once): a logical call (workflow, step, amount) is
  applied under one idempotency key, once; for a finished workflow, every planned
  charge was applied, its receipt is in the step's stored answer, and no ledger
  entry is left ``committing``.
- **orphans**: no chat of the schedule's workflows is left unarchived.
"""

from __future__ import annotations

from collections import defaultdict

from prefect.client.schemas.objects import FlowRun, StateType

from coder_chat.durable.markers import LABEL_WORKFLOW, step_marker
from coder_chat.durable.records import WorkflowState

from .check_resends import classify
from .evidence import Evidence
from .plan import FleetWorkflow
from .verdicts import Findings

Call = tuple[str, int | None, int]


def check_finished(ev: Evidence) -> Findings:
    findings = Findings()
    restarted = any(f.fault.kind == "restart-prefect" and f.started for f in ev.played.faults)
    finished_first = {p.run_id for p in ev.played.people if p.finished_first}
    for wf in ev.workflow_ids:
        record, runs = ev.workflows[wf], ev.runs[wf]
        state = record.state.value if record else "never begun"
        # A run whose process died once the workflow had ended is marked so by the sweep;
        # one a person cancelled as its workflow finished ends Cancelled, as they asked.
        completed = any(
            _type(r) == StateType.COMPLETED
            or (_type(r) == StateType.CRASHED and _ended_first(r))
            or (_type(r) == StateType.CANCELLED and str(r.id) in finished_first)
            for r in runs
        )
        if record is not None and record.state == WorkflowState.FINISHED and completed:
            continue
        told = ", ".join(f"{r.name} {_state(r)} on {ev.host_of(str(r.id))}" for r in runs)
        after = " (Prefect's server was restarted in this schedule)" if restarted else ""
        findings.add("unfinished workflows", f"{wf}: {state} in the store; runs: {told}{after}")
    return findings


def _type(run: FlowRun) -> StateType | None:
    return run.state.type if run.state else None


def _ended_first(run: FlowRun) -> bool:
    message = run.state.message if run.state else None
    return "before it could tell Prefect" in (message or "")


def _state(run: object) -> str:
    state = getattr(run, "state", None)
    if state is None:
        return "no state"
    message = f": {state.message[:160]}" if state.message else ""
    return f"{state.type.value}/{state.name}{message}"


def logical_calls(ev: Evidence) -> dict[Call, set[str]]:
    """The applied idempotency keys of the schedule's chats, by logical call."""
    calls: dict[Call, set[str]] = defaultdict(set)
    for key in ev.applied:
        _, chat_id, call_id = key.split("/", 2)
        chat = ev.truth.chats.get(chat_id)
        workflow_id = chat.labels.get(LABEL_WORKFLOW, "") if chat else ""
        if workflow_id not in ev.workflow_ids:
            continue
        amount = int(ev.receipts[key].rsplit("-", 1)[1])
        calls[(workflow_id, ev.truth.call_step(chat_id, call_id), amount)].add(key)
    return calls


def check_charges(ev: Evidence) -> Findings:
    """Every effect once: never under two keys; and, for a finished workflow, applied,
    its receipt in the step's stored answer, and its ledger entry ``done``."""
    findings = Findings()
    calls = logical_calls(ev)
    for (wf, number, amount), booked in sorted(calls.items(), key=str):
        if len(booked) > 1:
            findings.add(
                "double charges", f"{wf} step {number}: {amount} cents under {len(booked)} keys"
            )
    for workflow in _finished(ev):
        findings.merge(_applied(ev, workflow, calls))
        findings.merge(_ledger_done(ev, workflow.workflow_id))
    return findings


def _applied(ev: Evidence, workflow: FleetWorkflow, calls: dict[Call, set[str]]) -> Findings:
    findings, wf = Findings(), workflow.workflow_id
    stored = {s.step: s.text for s in ev.steps[wf]}
    for number, step in enumerate(workflow.steps, start=1):
        for amount in step.amounts:
            keys = sorted(calls.get((wf, number, amount), set()))
            if not keys:
                findings.add("lost effects", f"{wf} step {number}: {amount} cents never charged")
            elif f"charged {amount} cents: receipt {ev.receipts[keys[0]]}" not in stored.get(
                number, ""
            ):
                findings.add(
                    "lost effects",
                    f"{wf} step {number}: no receipt of {amount} cents in its result",
                )
    return findings


def _ledger_done(ev: Evidence, wf: str) -> Findings:
    findings = Findings()
    for chat in ev.truth.workflow_chats(wf):
        for entry in ev.ledger.get(chat.id, []):
            if entry.state != "done":
                findings.add(
                    "lost effects",
                    f"{wf}: the ledger entry of {entry.tool_name} call {entry.tool_call_id} "
                    f"({entry.marker}) was left {entry.state} by a finished workflow",
                )
    return findings


def check_results(ev: Evidence) -> Findings:
    """Each finished step's stored answer is the server's answer to a whole attempt."""
    findings = Findings()
    in_flight = [f for record in ev.played.faults for f in record.in_flight]
    for workflow in _finished(ev):
        wf = workflow.workflow_id
        stored = {s.step: s for s in ev.steps[wf]}
        for number in range(1, len(workflow.steps) + 1):
            result = stored.get(number)
            if result is None:
                findings.add("lost results", f"{wf} step {number}: no stored result")
                continue
            tries = ev.truth.attempts(wf, number)
            kinds = classify(ev.truth, in_flight, step_marker(wf, number), tries)
            valid = tries[:1]
            for kind, later in zip(kinds, tries[1:], strict=True):
                valid = [later] if kind == "cut short" else [*valid, later]
            if not result.text or result.text not in {ev.truth.reply_to(t) for t in valid}:
                findings.add(
                    "lost results",
                    f"{wf} step {number}: {result.text[:80]!r} is not the committed answer",
                )
    return findings


def _finished(ev: Evidence) -> list[FleetWorkflow]:
    """The schedule's workflows the store holds finished (the others are reported unfinished)."""
    return [
        w
        for w in ev.played.schedule.workflows
        if (record := ev.workflows[w.workflow_id]) is not None
        and record.state == WorkflowState.FINISHED
    ]


def check_usage(ev: Evidence) -> Findings:
    """A finished workflow's recorded usage (its steps', and what its chat ran after the
    last) equals what the simulator's assistant messages on its chats reported, exactly."""
    findings = Findings()
    for workflow in _finished(ev):
        wf = workflow.workflow_id
        record = ev.workflows[wf]
        assert record is not None  # finished
        recorded, committed = record.usage(ev.steps[wf]), ev.truth.usage(wf)
        if recorded != committed:
            findings.add(
                "miscounted usage",
                f"{wf}: recorded {recorded.messages} model steps, {recorded.tokens} tokens; "
                f"its chats committed {committed.messages}, {committed.tokens} tokens",
            )
    return findings


def check_orphans(ev: Evidence) -> Findings:
    findings = Findings()
    for wf in ev.workflow_ids:
        for chat in ev.truth.workflow_chats(wf):
            if not chat.archived:
                findings.add("live orphans", f"{wf}: chat {chat.id} [{chat.status}] unarchived")
    return findings
