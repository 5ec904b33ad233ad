import httpx
from prefect import flow
from prefect.input import RunInput
from pydantic import BaseModel, Field

from prefect_coder import CoderCredentials, DurableChat, PostgresLedger, SqliteLedger, durable_tool
from prefect_coder.demo_tools import PaymentsSettings


class RefundPlan(BaseModel):
    amount_cents: int
    reason: str


class Approval(RunInput):
    approved: bool = Field(
        default=False, description="Turn on to approve the refund; left off, it is declined."
    )


@durable_tool
async def issue_refund(order_id: str, amount_cents: int, idempotency_key: str) -> str:
    """Refund an order (amount in cents). Returns the receipt."""
    async with httpx.AsyncClient(base_url=PaymentsSettings().url, timeout=10) as payments:
        response = await payments.post(
            "/refunds",
            json={"order_id": order_id, "amount_cents": amount_cents},
            headers={"Idempotency-Key": idempotency_key},  # applied once, whatever crashes
        )
        response.raise_for_status()
    return f"refunded {amount_cents} cents: receipt {response.json()['receipt']}"


@flow(name="refund-order")
async def refund_order(
    order_id: str,
    complaint: str,
    approval_above_cents: int = 10_000,
    suspend: bool = False,
    credentials: CoderCredentials | None = None,
    ledger: SqliteLedger | PostgresLedger | None = None,
) -> str:
    async with DurableChat(
        f"refund-{order_id}", credentials=credentials, ledger=ledger, tools=[issue_refund]
    ) as chat:
        plan = await chat.turn(
            f"Order {order_id}: the customer wrote {complaint!r}. Plan the refund.",
            output=RefundPlan,
        )
        if plan.output.amount_cents > approval_above_cents:
            # A person decides, once: a run that goes again is given the same answer.
            # Suspended, the run leaves its worker until the answer comes.
            approval = await chat.wait_for_input(Approval, timeout=86_400, suspend=suspend)
            if not approval.approved:
                reply = await chat.turn("The refund was declined. Write to the customer.")
                return reply.text
        refund = await chat.turn(
            f"Refund {plan.output.amount_cents} cents for order {order_id} with issue_refund."
        )
        return refund.text
