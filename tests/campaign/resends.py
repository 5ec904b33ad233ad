"""Was a step ever sent again after an attempt that had finished?

For each step, consecutive attempts (earlier, later) are classified from ground truth:

- **cut short** (counted): the server accepted an interrupt of the earlier attempt's
  chat between the two, or that chat was seen in ``error``, or the earlier attempt
  had no committed answer when the later one landed, or the server's tool deadline
  answered one of its calls and no later answer of that tool reached the model (it
  finished without seeing what its tool did), or one of its calls was answered "not
  run" when its chat was retired (a person's cancel: its tool never ran);
- **late** duplicate (counted): the journal, read when a run was killed, showed this
  step's send in flight on that chat, and both attempts landed past its horizon (one
  of them is that send, landing late: the window the contract leaves open);
- otherwise **resent**: a finished step sent again (a violation).
"""

from __future__ import annotations

from datetime import datetime

from coder_chat.durable.markers import step_marker
from coder_chat.durable.reconcile import NO_RESULT, NOT_RUN
from coder_chat.simulator import Simulator
from coder_chat.simulator.engine import TIMED_OUT
from coder_chat.simulator.state import Message
from tests.lab.resends import pair_kinds
from tests.lab.truth import StatusLog, attempts, reply_to
from tests.lab.verdicts import Findings, Pair

from .drive import WorkflowOutcome


def check_resends(sim: Simulator, outcome: WorkflowOutcome, statuses: StatusLog) -> Findings:
    findings = Findings()
    wf = outcome.plan.workflow_id
    for step in range(1, len(outcome.plan.steps) + 1):
        tries = attempts(sim, wf, step)
        kinds = classify(sim, outcome, statuses, step, tries)
        for number, (kind, later) in enumerate(zip(kinds, tries[1:], strict=True), start=2):
            findings.judge_resend(
                kind,
                f"{wf} step {step}: attempt {number} sent after attempt {number - 1} "
                f"had finished (message {later.id} after {tries[number - 2].id})",
            )
    return findings


def classify(
    sim: Simulator,
    outcome: WorkflowOutcome,
    statuses: StatusLog,
    step: int,
    tries: list[Message],
) -> list[Pair]:
    """What each consecutive pair of the step's attempts was."""
    marker = step_marker(outcome.plan.workflow_id, step)
    budget = [r for r in outcome.in_flight if r.marker == marker]
    return pair_kinds(
        tries, budget, lambda earlier, later: cut_short(sim, statuses, earlier, later)
    )


def cut_short(sim: Simulator, statuses: StatusLog, earlier: Message, later: Message) -> bool:
    chat = str(earlier.chat_id)
    start, end = earlier.created_at, later.created_at
    interrupted = any(
        str(i.chat_id) == chat and i.http_status == 200 and start <= i.at <= end
        for i in sim.records.interrupts
    )
    unanswered = not reply_to(sim, earlier, until=end)
    return (
        interrupted
        or unanswered
        or statuses.errored_between(chat, start, end)
        or timed_out_unseen(sim, chat, start, end)
        or answered_not_run(sim, chat, start, end)
    )


def answered_not_run(sim: Simulator, chat: str, start: datetime, end: datetime) -> bool:
    """A call answered "not run" as its chat was retired (by a cancel): the model went on
    without its tool, so what it said after is no finished step's answer."""
    return any(
        str(r.chat_id) == chat
        and start <= r.at <= end
        and r.is_error
        and any(text in str(r.output) for text in (NOT_RUN, NO_RESULT))
        for r in sim.records.tool_results
    )


def timed_out_unseen(sim: Simulator, chat: str, start: datetime, end: datetime) -> bool:
    """A call the server's deadline answered, with no real answer of that tool after it."""
    window = [
        r for r in sim.records.tool_results if str(r.chat_id) == chat and start <= r.at <= end
    ]
    return any(
        r.synthetic
        and r.output == TIMED_OUT
        and not any(
            not later.synthetic and later.tool_name == r.tool_name and later.at >= r.at
            for later in window
        )
        for r in window
    )
