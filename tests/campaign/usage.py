"""Did every finished workflow record exactly what it consumed?

The simulator is the ground truth: each assistant message it committed on a chat of the
workflow carries that model step's usage. The usage the store holds for the workflow's
steps, summed, must equal the sum over all of them: nothing lost to a crash (an attempt
recovered, or cut short and sent again), nothing counted twice by a recovery, a resend
or a step answered from the store or from Prefect's cache.
"""

from __future__ import annotations

from coder_chat.durable.records import WorkflowState
from coder_chat.durable.store import DurableStore
from coder_chat.simulator import Simulator
from tests.lab.truth import committed_usage, workflow_chats
from tests.lab.verdicts import Findings


async def check_usage(
    sim: Simulator, store: DurableStore, tenant: str, workflow_id: str
) -> Findings:
    """A finished workflow's recorded usage against what its chats committed."""
    findings = Findings()
    workflow = await store.get_workflow(tenant, workflow_id)
    if workflow is None or workflow.state != WorkflowState.FINISHED:
        return findings
    steps = await store.list_steps(tenant, workflow_id)
    recorded = workflow.usage(steps)
    committed = committed_usage(workflow_chats(sim, workflow_id))
    if recorded != committed:
        per_step = ", ".join(f"{s.step}: {s.usage.messages} msg/{s.usage.tokens}" for s in steps)
        after = workflow.after_steps
        if after is not None:
            per_step += f", after step {after.step}: {after.usage.messages} msg"
        findings.add(
            "miscounted usage",
            f"{workflow_id}: recorded {recorded.messages} model steps, {recorded.tokens} "
            f"tokens ({per_step}); its chats committed {committed.messages}, "
            f"{committed.tokens} tokens",
        )
    return findings
