"""Workflows written through a store's own write methods, and aged behind its back.

Shared by the store's prune tests and the ``prefect-coder workflows`` CLI tests.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from coder_chat.durable.records import Fence, JournalEntry, StepRecord, WorkflowState
from coder_chat.durable.store import DurableStore
from coder_chat.protocol.usage import UsageTotals

from .backends import Backend


def chat_of(workflow_id: str) -> str:
    return f"chat-{workflow_id}"


async def seed_workflow(
    store: DurableStore,
    tenant: str,
    workflow_id: str,
    *,
    state: WorkflowState | None = WorkflowState.FINISHED,
    steps: int = 2,
    deployment: str = "prod",
) -> Fence:
    """A workflow as a run leaves it: a journaled chat, ``steps`` finished steps on it (step
    n's model steps n, of 110n tokens and 1000n micros), a
    tool call in the ledger, an input and a patch; then ended in ``state`` (None: running)."""
    fence = await store.begin_run(
        tenant, workflow_id, deployment=deployment, flow_run_id=f"run-{workflow_id}"
    )
    chat = chat_of(workflow_id)
    for step in range(1, steps + 1):
        marker = f"{workflow_id}/step-{step}"
        await store.write_journal(
            fence, chat, JournalEntry(state="submitting", marker=marker, attempt=1)
        )
        await store.complete_step(
            fence,
            StepRecord(
                tenant=tenant,
                workflow_id=workflow_id,
                step=step,
                chat_id=chat,
                last_seen_message_id=10 * step,
                text=f"answer {step} of {workflow_id}",
                verdict="ran" if step == 1 else "recovered",
                prompt=f"Prompt {step} of {workflow_id}: " + "please do it " * 12,
                usage=UsageTotals(
                    messages=step,
                    input_tokens=100 * step,
                    output_tokens=10 * step,
                    total_cost_micros=1000 * step,
                ),
            ),
        )
    await store.claim_tool(fence, chat, f"call-{workflow_id}", tool_name="refund")
    await store.complete_tool(fence, chat, f"call-{workflow_id}", output={"ok": True})
    await store.save_inputs(fence, ["approved"])
    await store.save_patches(fence, {"shorter-prompts": True})
    if state is not None:
        await store.finish(fence, state)
    return fence


async def age_workflow(backend: Backend, tenant: str, workflow_id: str, days: float) -> datetime:
    """Set the workflow's ``updated_at`` ``days`` back, as if it ended then; returns it."""
    when = datetime.now(UTC) - timedelta(days=days)
    stamp = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    await backend.execute(
        "UPDATE workflows SET body = json_set(body, '$.updated_at', ?) "
        "WHERE tenant = ? AND workflow_id = ?",
        "UPDATE {s}.workflows SET body = jsonb_set(body, '{{updated_at}}', to_jsonb($1::text)) "
        "WHERE tenant = $2 AND workflow_id = $3",
        stamp,
        tenant,
        workflow_id,
    )
    return when
