"""One idempotency key booked per logical call, applied once: else a double charge.

A logical call is (workflow, step, amount): the campaign's steps charge distinct
amounts, and the server's re-call of a timed-out tool (same step, same arguments,
new call id) is the same logical call. Ground truth is the payments fake's applied
keys (with their receipts, which name the amount), and the simulator's history,
which says which step's attempt made each call.
"""

from __future__ import annotations

from collections import defaultdict

from coder_chat.durable.markers import LABEL_WORKFLOW
from coder_chat.simulator import Simulator
from coder_chat.simulator.errors import ApiError
from prefect_coder.payments import Ledger
from tests.lab.truth import call_step
from tests.lab.verdicts import Findings

Call = tuple[str, int | None, int]


def logical_calls(sim: Simulator, payments: Ledger) -> dict[Call, set[str]]:
    """The applied keys of each logical call."""
    calls: dict[Call, set[str]] = defaultdict(set)
    for key in payments.applied:
        _, chat_id, call_id = key.split("/", 2)
        try:
            workflow_id = sim.chat(chat_id).labels.get(LABEL_WORKFLOW, "")
        except (ApiError, ValueError):
            workflow_id = ""
        step = call_step(sim, workflow_id, chat_id, call_id)
        amount = int(payments.receipts[key].rsplit("-", 1)[1])
        calls[(workflow_id, step, amount)].add(key)
    return calls


def receipt_for(
    sim: Simulator, payments: Ledger, workflow_id: str, step: int, amount: int
) -> str | None:
    keys = sorted(logical_calls(sim, payments).get((workflow_id, step, amount), set()))
    return payments.receipts[keys[0]] if keys else None


def check_charges(sim: Simulator, payments: Ledger) -> Findings:
    """A logical call booked under two keys was charged twice; so was one key applied
    twice (the payments fake honours its keys, as a real one would: never, unless it broke)."""
    findings = Findings()
    for key, count in sorted(payments.applied.items()):
        if count != 1:
            findings.add("double charges", f"key {key} applied {count} times")
    for (workflow_id, step, amount), keys in sorted(logical_calls(sim, payments).items(), key=str):
        if len(keys) > 1:
            findings.add(
                "double charges",
                f"{workflow_id} step {step}: {amount} cents booked under {len(keys)} keys",
            )
    return findings
