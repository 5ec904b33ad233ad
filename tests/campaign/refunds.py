"""The README's ``refund_order`` as a campaign workflow: its case, its steps, its script.

A refund schedule runs the user's own flow (``prefect_coder.examples.refund``) in
the crash lab's children instead of ``durable_chat``: turn 1 plans the refund with a
structured answer, a person is asked above the limit (a watcher answers the paused
flow run through Prefect's API, the same way every time), then a turn either
refunds through the durable tool ``issue_refund`` or writes to the customer. The
simulator is scripted per schedule, so the flow's natural prompts get the answers
the schedule drew.
"""

from __future__ import annotations

from random import Random
from typing import Any

from tests.lab.steps import Kill, RefundCase, Step, prompt_json

REFUND_ORDER = "prefect_coder.examples.refund:refund_order"
REFUND_PLAN = "prefect_coder.examples.refund:RefundPlan"
LIMIT = 10_000
REASON = "as the customer wrote"
COMPLAINTS = ("It arrived broken", "Never arrived", "Wrong size", "Scratched", "Dented")
#: The person approves this often when asked.
APPROVALS = 0.6
#: How long after its start a run may be killed: one that asks a person lasts 10 s more
#: (Prefect looks at a paused run every 10 s), one that does not, a few seconds.
MOMENT_RANGE = 14.0
SHORT_MOMENT_RANGE = 5.0


def plan_answer(case: RefundCase) -> dict[str, Any]:
    """What the scripted model files as the refund plan (turn 1)."""
    return {"amount_cents": case.amount_cents, "reason": REASON}


def steps_of(case: RefundCase) -> tuple[Step, ...]:
    """The two turns the flow takes for ``case``, with its own prompts."""
    plan = Step(
        "json",
        f"Order {case.order_id}: the customer wrote {case.complaint!r}. Plan the refund.",
        structured=plan_answer(case),
        model=REFUND_PLAN,
    )
    if not case.refunds:
        return plan, Step("plain", "The refund was declined. Write to the customer.")
    refund = Step(
        "tool",
        f"Refund {case.amount_cents} cents for order {case.order_id} with issue_refund.",
        (case.amount_cents,),
        verb="refunded",
    )
    return plan, refund


def scripts_of(case: RefundCase) -> list[tuple[str, str]]:
    """``(when, then)`` for the simulator: the plan's answer, and the refund's tool call."""
    refund = {"order_id": case.order_id, "amount_cents": case.amount_cents}
    return [
        (f"Order {case.order_id}: ", f"/json {prompt_json(plan_answer(case))}"),
        (
            f"for order {case.order_id} with issue_refund",
            f"/tool issue_refund {prompt_json(refund)}",
        ),
    ]


def params_of(case: RefundCase, flow: str = REFUND_ORDER) -> dict[str, Any]:
    """A crash-lab child's parameters: the flow, and its own parameters."""
    return {
        "flow": flow,
        "order_id": case.order_id,
        "complaint": case.complaint,
        "approval_above_cents": case.approval_above_cents,
    }


def draw_case(rng: Random, order_id: str, asks: bool | None = None) -> RefundCase:
    """A refund below or above the limit (``asks``, drawn when not given)."""
    if asks is None:
        asks = rng.random() < 0.5
    amount = rng.randint(LIMIT + 1, 5 * LIMIT) if asks else rng.randint(100, LIMIT)
    return RefundCase(
        order_id,
        amount,
        LIMIT,
        approved=rng.random() < APPROVALS,
        complaint=rng.choice(COMPLAINTS),
        answer_after=round(rng.uniform(0.0, 3.0), 1),
    )


def draw_refund_kill(rng: Random, case: RefundCase, run: int) -> Kill:
    """A kill of one run of ``case``: at a moment, after a prompt, inside the refund,
    or while the run waits for the person. No held send: the example's request timeout
    (300 s, it takes no settings) would make its relaunch wait five minutes."""
    kinds = ["moment", "after-prompt", "in-tool", "paused"]
    weights = [0.3, 0.25, 0.3 if case.refunds else 0.0, 0.25 if case.asks else 0.0]
    kind = rng.choices(kinds, weights=weights)[0]
    if kind == "moment":
        top = MOMENT_RANGE if case.asks else SHORT_MOMENT_RANGE
        return Kill("moment", delay=round(rng.uniform(0.0, top), 2))
    if kind == "in-tool":
        return Kill("in-tool", nth=1, phase=rng.choice(("before", "after")))
    if kind == "paused":
        return Kill("paused")
    nth = rng.randint(1, 2 if run == 1 else 1)
    return Kill("after-prompt", nth=nth, delay=round(rng.uniform(0.0, 1.5), 2))
