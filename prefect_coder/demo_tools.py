"""The demo's client tool: charge a card through the fake payments service, durably."""

from __future__ import annotations

import httpx
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from coder_chat.durable import durable_tool


class PaymentsSettings(BaseSettings):
    """Where the payments service is (``PAYMENTS_URL``)."""

    model_config = SettingsConfigDict(env_prefix="PAYMENTS_", extra="ignore")
    url: str = Field(default="http://127.0.0.1:8765")


@durable_tool
async def charge_card(amount_cents: int, idempotency_key: str) -> str:
    """Charge the customer's card (amount in cents). Returns the receipt."""
    async with httpx.AsyncClient(base_url=PaymentsSettings().url, timeout=10) as http:
        response = await http.post(
            "/charges",
            json={"amount_cents": amount_cents},
            headers={"Idempotency-Key": idempotency_key},
        )
        response.raise_for_status()
        receipt: str = response.json()["receipt"]
    return f"charged {amount_cents} cents: receipt {receipt}"
