"""A workflow whose ledger was lost, while Prefect's result storage kept its finished steps:
the steps come back from the cache, are written to the new ledger, and the next step goes
on in the same chat (before, it opened a new chat and split the conversation)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect import flow

from coder_chat.durable.markers import LABEL_WORKFLOW
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator import Simulator
from prefect_coder import DurableChat, SqliteLedger, WorkflowSettings

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.timeout(120)]


@flow
async def conversation(workflow_id: str, ledger_path: str, prompts: list[str]) -> list[str]:
    settings = WorkflowSettings(archive_at_end=False)
    async with DurableChat(
        workflow_id, ledger=SqliteLedger(path=ledger_path), settings=settings
    ) as chat:
        for prompt in prompts:
            await chat.turn(prompt)
    return [r.verdict for r in chat.results]


async def test_steps_from_the_result_cache_carry_the_conversation_into_a_new_ledger(
    sim: Simulator, coder_env: Path, tmp_path: Path
) -> None:
    wid, first, second = "kept-by-cache", str(tmp_path / "a.sqlite3"), str(tmp_path / "b.sqlite3")
    prompts = ["Read the logs", "Find the cause"]
    assert await conversation(wid, first, prompts) == ["ran", "ran"]
    # The ledger is gone (a container's disk); Prefect's results are not.
    verdicts = await conversation(wid, second, [*prompts, "Write the fix"])
    assert verdicts == ["cached", "cached", "ran"]
    chats = [c for c in sim.chats() if c.labels.get(LABEL_WORKFLOW) == wid]
    assert len(chats) == 1, "the conversation was split over two chats"
    store = SqliteStore(Path(second))
    try:
        tenant = str(sim.organization_id)
        workflow = await store.get_workflow(tenant, wid)
        steps = await store.list_steps(tenant, wid)
    finally:
        await store.close()
    assert workflow is not None and workflow.chat_id == str(chats[0].id)
    assert [s.step for s in steps] == [1, 2, 3]
    assert [s.prompt for s in steps] == [*prompts, "Write the fix"]
