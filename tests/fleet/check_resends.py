"""Was a step ever sent again after an attempt that had finished? (As in the campaign.)

For each step, consecutive attempts (earlier, later) are classified from ground truth:
**cut short** when the server accepted an interrupt of the earlier attempt's chat
between the two, or the earlier had no committed answer when the later landed, or
the server's tool deadline answered one of its calls and no later answer of that
tool reached the model; **late** when the journal showed this step's send in
flight on that chat when its host was hit and the earlier landed past its horizon
(the window the contract leaves open); otherwise **resent**, a violation.
"""

from __future__ import annotations

from datetime import datetime

from coder_chat.durable.markers import step_marker
from coder_chat.simulator.engine import TIMED_OUT
from tests.lab.resends import pair_kinds
from tests.lab.verdicts import Pair

from .evidence import Evidence
from .journal import InFlight
from .truth import Message, Truth
from .verdicts import Findings


def check_resends(ev: Evidence) -> Findings:
    findings = Findings()
    in_flight = [f for record in ev.played.faults for f in record.in_flight]
    for workflow in ev.played.schedule.workflows:
        wf = workflow.workflow_id
        for step in range(1, len(workflow.steps) + 1):
            tries = ev.truth.attempts(wf, step)
            kinds = classify(ev.truth, in_flight, step_marker(wf, step), tries)
            for number, (kind, later) in enumerate(zip(kinds, tries[1:], strict=True), start=2):
                findings.judge_resend(
                    kind,
                    f"{wf} step {step}: attempt {number} (message {later.id}, "
                    f"{later.created_at:%H:%M:%S.%f}) sent after attempt {number - 1} "
                    "had finished",
                )
    return findings


def classify(
    truth: Truth, in_flight: list[InFlight], marker: str, tries: list[Message]
) -> list[Pair]:
    budget = [r for r in in_flight if r.marker == marker]
    return pair_kinds(tries, budget, lambda earlier, later: cut_short(truth, earlier, later))


def cut_short(truth: Truth, earlier: Message, later: Message) -> bool:
    chat, start, end = earlier.chat_id, earlier.created_at, later.created_at
    interrupted = any(
        i.chat_id == chat and i.http_status == 200 and start <= i.at <= end
        for i in truth.interrupts
    )
    return (
        interrupted
        or not truth.reply_to(earlier, until=end)
        or timed_out_unseen(truth, chat, start, end)
    )


def timed_out_unseen(truth: Truth, chat: str, start: datetime, end: datetime) -> bool:
    window = [r for r in truth.tool_results if r.chat_id == chat and start <= r.at <= end]
    return any(
        r.synthetic
        and r.output == TIMED_OUT
        and not any(not o.synthetic and o.tool_name == r.tool_name and o.at >= r.at for o in window)
        for r in window
    )
