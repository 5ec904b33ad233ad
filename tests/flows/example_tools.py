"""Tools the flow tests name by import path, as a user would from the UI."""

from __future__ import annotations

from pydantic import BaseModel

from coder_chat.durable import durable_tool

#: Effects applied, per idempotency key (an in-process stand-in for a payments service).
CHARGES: dict[str, int] = {}


@durable_tool
async def charge_card(amount_cents: int, idempotency_key: str) -> str:
    """Charge the customer's card."""
    CHARGES[idempotency_key] = CHARGES.get(idempotency_key, 0) + 1
    return f"charged {amount_cents} (receipt {len(CHARGES)})"


async def plain_lookup(query: str) -> str:
    """Look something up (not durable)."""
    return f"found {query}"


class Verdict(BaseModel):
    verdict: str
    score: float
