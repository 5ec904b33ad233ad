"""Tools the flow tests name by import path, as a user would from the UI."""

from __future__ import annotations

import gc

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


#: ``gc.get_freeze_count()`` as each call of ``heap_probe`` saw it, mid-run.
FREEZE_COUNTS: list[int] = []


@durable_tool
async def heap_probe(note: str, idempotency_key: str) -> str:
    """Say how many objects the garbage collector leaves alone right now."""
    FREEZE_COUNTS.append(gc.get_freeze_count())
    return f"{note}: {FREEZE_COUNTS[-1]} frozen"


class Verdict(BaseModel):
    verdict: str
    score: float
