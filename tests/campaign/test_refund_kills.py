"""The README's own flow, ``refund_order``, killed with SIGKILL at random and relaunched.

Each schedule (seeded: ``OWN_FLOW_SEED``, default below) runs the example in real
child processes: a refund below or above the approval limit, the person's answer
given through Prefect's API to every paused run (approved or declined, the same way
each time), one or two kills of the whole process group (at a random moment, after
a prompt, during the pause, inside ``issue_refund`` before or after the payments
fake applied it), each followed by a new child with the same parameters. Then the
campaign's checks: no finished turn resent (cut-short resubmissions and late
duplicates are counted, not violations), the refund applied once, under one key,
when approved or below the limit and never when declined, every stored step equal
to what the chat answered and the flow's return value its last turn's, the chat
archived by the flow itself, and the token in none of the places our side wrote.

The last test is the control: the same refund written without the durable layer
(``plain_refund.py``), killed after its refund was applied, is caught by the same
checks: a finished turn resent, the customer refunded twice.
"""

from __future__ import annotations

import os

import pytest

from tests.campaign.draw import refund_plan
from tests.lab.children import CrashLab
from tests.lab.leaks import check_no_token
from tests.lab.steps import Kill, RefundCase

from .refund_kills import draw_schedule, judge, play, story

pytestmark = pytest.mark.timeout(300)

SEED = int(os.environ.get("OWN_FLOW_SEED", "20260612"))
#: Schedules in CI; more with ``OWN_FLOW_COUNT`` (and another ``OWN_FLOW_SEED``).
COUNT = int(os.environ.get("OWN_FLOW_COUNT", "4"))
PLAIN_REFUND_ORDER = "tests.campaign.plain_refund:plain_refund_order"


@pytest.mark.parametrize("index", range(COUNT))
async def test_refund_order_survives_random_kills(lab: CrashLab, index: int) -> None:
    schedule = draw_schedule(SEED, index)
    played = await play(lab, schedule.plan)
    findings = await judge(lab, played)
    print(story(schedule, played, findings))
    print(f"cut-short resubmissions {findings.cut_short}, late duplicates {findings.late}")
    assert findings.violations == [], story(schedule, played, findings)
    case = schedule.case
    refunds = [
        k
        for k in lab.payments.applied
        if lab.payments.receipts[k].endswith(f"-{case.amount_cents}")
    ]
    assert len(refunds) == (1 if case.refunds else 0), lab.payments.applied
    assert len(lab.payments.applied) == len(refunds), lab.payments.applied
    if case.asks:  # every run that got past the plan asked the person again
        assert played.approver.answered, "no pause was answered"
    await check_no_token(lab)


async def test_the_checks_catch_a_refund_flow_without_the_durable_layer(lab: CrashLab) -> None:
    case = RefundCase("plain-1", 2500, 10_000, approved=True, complaint="It arrived broken")
    plan = refund_plan(case, (Kill("in-tool", phase="after"),))  # applied, then killed
    played = await play(lab, plan, flow=PLAIN_REFUND_ORDER)
    findings = await judge(lab, played)
    assert findings.count("resent finished steps") >= 1, findings
    assert findings.count("double charges") == 1, findings
    assert len(lab.payments.applied) == 2, lab.payments.applied
