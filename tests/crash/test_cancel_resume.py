"""A person cancels a workflow whose first turn's process died before it checkpointed
its chat, then runs it again (the resume): the resume carries on in that chat and
recovers the turn its dead process finished there, never sends it again, and never
charges the card twice (DESIGN.md points 3, 4 and 14; the campaign's 20261311/121).
"""

from __future__ import annotations

import pytest

from coder_chat import ChatClient
from coder_chat.durable.context import StepTools
from coder_chat.durable.records import WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from prefect_coder.demo_tools import charge_card
from prefect_coder.operations import Runtime, cancel_workflow
from tests.lab.children import CHARGE_CARD, CrashLab

from .invariants import Expect, check_invariants
from .story import only_chat, stored, tool_prompts

pytestmark = pytest.mark.timeout(240)


async def test_a_resume_after_a_cancel_recovers_the_first_turn_a_dead_process_finished(
    lab: CrashLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    wf, prompts = "wf-cancel-first-turn", tool_prompts(1)
    # The first turn's charge is applied, and its process killed before it records
    # anything more: its chat is in no checkpoint.
    lab.payments.hold("after")
    first = await lab.start(workflow_id=wf, prompts=prompts, tools=[CHARGE_CARD], reruns=1)
    held = await lab.held(lab.payments.wait_held(timeout=90), first, "charge held")
    await lab.crash(first)
    lab.payments.decide(held.id, "release")
    workflow, _, entries = await stored(lab, wf)
    assert workflow is not None and workflow.chat_id is None
    key = entries[0].idempotency_key

    # The person cancels it: the pause is answered from the ledger (the effect re-driven
    # under its key, applied once), the first turn finishes, the chat is archived.
    monkeypatch.setenv("PAYMENTS_URL", lab.payments_url)  # the re-driven charge goes there
    store, lines = SqliteStore(lab.db), list[str]()
    try:
        async with ChatClient(base_url=lab.sim.base_url, token=lab.sim.token) as client:
            rt = Runtime(client, store, lab.tenant)
            cancelled = await cancel_workflow(rt, wf, StepTools.build([charge_card]), lines.append)
    finally:
        await store.close()
    chat = only_chat(lab, wf)
    assert [(c.chat_id, c.action) for c in cancelled.chats] == [(str(chat.id), "archived")]
    workflow, _, _ = await stored(lab, wf)
    assert workflow is not None and workflow.state == WorkflowState.CANCELLED
    assert workflow.chat_id == str(chat.id)  # kept, so that a resume reopens it

    # The resume: the same workflow id and prompts.
    results = await lab.finish(
        await lab.start(workflow_id=wf, prompts=prompts, tools=[CHARGE_CARD])
    )
    await check_invariants(
        lab, results, Expect(wf, prompts, charges=1, verdicts={1: "recovered", 2: "ran"})
    )
    assert results[0]["chat_id"] == str(chat.id)
    assert lab.payments.applied == {key: 1}
