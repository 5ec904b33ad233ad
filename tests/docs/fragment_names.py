"""The names the guides' python fragments take from the prose around them, with their types.

A fragment's marker lists what it uses (``<!-- check: types uses=payments,url -->``) and is
type-checked as a module that imports those names from here. Declarations only: this module is
read by mypy, never imported (``tests/docs/test_python_blocks.py`` binds live values to the
names of the blocks it runs).
"""

from __future__ import annotations

import uuid
from typing import Protocol

from prefect_coder import DurableChat
from prefect_coder.examples.refund import RefundPlan as RefundPlan  # the README's example


class Payments(Protocol):
    """The reader's payments service: charges a card at most once per idempotency key."""

    async def charge(self, amount_cents: int, *, idempotency_key: str) -> str: ...


payments: Payments
url: str  # the Coder deployment, its session token and its organization (CODER_* variables)
token: str
org: str
tickets: list[int]  # the reader's tickets, one workflow each
chat_id: uuid.UUID  # a chat the simulator holds
chat: DurableChat  # the workflow's chat, in a flow of your own
