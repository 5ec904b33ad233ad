"""The README's refund flow as a Prefect user would write it without the durable layer.

The negative control of ``test_refund_kills.py``: the same prompts, the same tool and
the same pause, each turn a bare ``ChatSession`` turn inside the flow. Its chat is
labelled and its prompts marked the way the durable layer does it, only so that the
same checks can read its history; nothing is stored. A relaunch starts over: it
sends the finished turns again, on a new chat, and runs the refund again under a
new idempotency key (the key names the chat and the call).
"""

from __future__ import annotations

from prefect import flow
from prefect.flow_runs import apause_flow_run

from coder_chat import ChatOptions, ChatSession
from coder_chat.durable.markers import LABEL_WORKFLOW, step_marker
from coder_chat.settings import CoderSettings
from prefect_coder.examples.refund import Approval, RefundPlan, issue_refund


def session_for(workflow_id: str) -> ChatSession:
    settings = CoderSettings()
    token = settings.session_token.get_secret_value() if settings.session_token else ""
    return ChatSession.connect(
        settings.url or "",
        token,
        settings.organization_id or "",
        tools=[issue_refund.tool],  # the function alone, without its ledger
        options=ChatOptions(labels={LABEL_WORKFLOW: workflow_id}),
    )


@flow(name="plain-refund-order", flow_run_name="refund-{order_id} · plain")
async def plain_refund_order(
    order_id: str, complaint: str, approval_above_cents: int = 10_000
) -> str:
    workflow_id = f"refund-{order_id}"

    def marked(step: int, prompt: str) -> str:
        return f"{step_marker(workflow_id, step)} {prompt}"

    async with session_for(workflow_id) as chat:
        plan = await chat.generate(
            marked(1, f"Order {order_id}: the customer wrote {complaint!r}. Plan the refund."),
            output_type=RefundPlan,
        )
        assert isinstance(plan.output, RefundPlan)
        if plan.output.amount_cents > approval_above_cents:
            approval = await apause_flow_run(wait_for_input=Approval, timeout=86_400)
            if not approval.approved:
                reply = await chat.generate(
                    marked(2, "The refund was declined. Write to the customer.")
                )
                return reply.text
        amount = plan.output.amount_cents
        refund = await chat.generate(
            marked(2, f"Refund {amount} cents for order {order_id} with issue_refund.")
        )
        return refund.text
