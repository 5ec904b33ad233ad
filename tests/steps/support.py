"""What the step tests share: a charge tool that counts its calls, and short timings."""

from __future__ import annotations

from coder_chat.client.options import ChatOptions
from coder_chat.durable.context import DurableOptions
from coder_chat.durable.tools import durable_tool

CHARGES: list[tuple[int, str]] = []


@durable_tool
async def charge_card(amount_cents: int, idempotency_key: str) -> str:
    """Charge the customer's card."""
    CHARGES.append((amount_cents, idempotency_key))
    return f"receipt-{len(CHARGES)}"


FAST = DurableOptions(
    chat=ChatOptions(request_timeout=10, redial_initial=0.01), step_deadline=30, poll_interval=0.02
)
