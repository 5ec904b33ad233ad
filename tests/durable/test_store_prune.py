"""Pruning ended workflows, on both stores: what goes, what stays, and what never goes.

Every test with ``backend``/``store`` runs on SQLite and Postgres (see conftest). Workflows
are written through the store's own write methods; their age is set behind its back.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from coder_chat.durable.base import ENDED_STATES, SWEEP_PREFIX, PruneRule
from coder_chat.durable.records import JournalEntry, WorkflowState
from coder_chat.durable.store import DurableStore, FencedOut
from coder_chat.durable.sweep import SWEEP_WORKFLOW, sweep_workflow_id
from coder_chat.errors import CoderConfigError

from .backends import Backend
from .seed import age_workflow, chat_of, seed_workflow

T = "org-1"
MONTH_AGO = timedelta(days=30)


def cutoff(age: timedelta = MONTH_AGO) -> datetime:
    return datetime.now(UTC) - age


async def rows_of(store: DurableStore, tenant: str, workflow_id: str) -> dict[str, int]:
    """How many rows of each kind the store still holds for one seeded workflow."""
    chat = chat_of(workflow_id)
    return {
        "workflow": int(await store.get_workflow(tenant, workflow_id) is not None),
        "steps": len(await store.list_steps(tenant, workflow_id)),
        "chats": len(await store.list_workflow_chats(tenant, workflow_id)),
        "ledger": len(await store.list_tools(tenant, chat)),
    }


GONE = {"workflow": 0, "steps": 0, "chats": 0, "ledger": 0}
WHOLE = {"workflow": 1, "steps": 2, "chats": 1, "ledger": 1}


async def test_prune_deletes_ended_workflows_past_retention_with_their_rows(
    backend: Backend,
) -> None:
    store = backend.open()
    for wf, state in [
        ("old-finished", WorkflowState.FINISHED),
        ("old-failed", WorkflowState.FAILED),
        ("old-cancelled", WorkflowState.CANCELLED),
        ("recent-finished", WorkflowState.FINISHED),
    ]:
        await seed_workflow(store, T, wf, state=state)
    for wf in ("old-finished", "old-failed", "old-cancelled"):
        await age_workflow(backend, T, wf, days=45)

    assert [w.workflow_id for w in await store.list_prunable(T, ended_before=cutoff())] == [
        "old-cancelled",
        "old-failed",
        "old-finished",
    ]
    before = store.commits
    pruned = await store.prune_workflows(T, ended_before=cutoff())
    assert pruned == ["old-cancelled", "old-failed", "old-finished"]
    assert store.commits == before + 1  # one write transaction
    for wf in pruned:
        assert await rows_of(store, T, wf) == GONE, wf
    assert await rows_of(store, T, "recent-finished") == WHOLE
    assert await store.prune_workflows(T, ended_before=cutoff()) == []


async def test_running_workflows_are_never_pruned(backend: Backend) -> None:
    store = backend.open()
    await seed_workflow(store, T, "old-running", state=None)
    await seed_workflow(store, T, "old-finished")
    await age_workflow(backend, T, "old-running", days=400)
    await age_workflow(backend, T, "old-finished", days=400)

    assert await store.prune_workflows(T, ended_before=cutoff()) == ["old-finished"]
    assert await rows_of(store, T, "old-running") == WHOLE
    # Asking for running ones is refused before anything is read or written.
    for states in ([WorkflowState.RUNNING], ["finished", "running"]):
        with pytest.raises(CoderConfigError, match="running workflow is never pruned"):
            await store.prune_workflows(T, ended_before=cutoff(), states=states)
        with pytest.raises(CoderConfigError, match="running workflow is never pruned"):
            await store.list_prunable(T, ended_before=cutoff(), states=states)
    assert await rows_of(store, T, "old-running") == WHOLE


async def test_a_workflow_that_runs_again_is_not_pruned(backend: Backend) -> None:
    """Ended long ago, then relaunched (``resume``): a new run took it, so it is running
    and stays, and the old run's fence still loses to the new one."""
    store = backend.open()
    old = await seed_workflow(store, T, "wf")
    await age_workflow(backend, T, "wf", days=90)
    new = await store.begin_run(T, "wf", deployment="prod")
    assert await store.prune_workflows(T, ended_before=cutoff()) == []
    await store.heartbeat(new)
    with pytest.raises(FencedOut):
        await store.heartbeat(old)


async def test_the_sweeps_own_records_are_never_pruned(backend: Backend) -> None:
    assert SWEEP_PREFIX == SWEEP_WORKFLOW
    store = backend.open()
    lease = await store.begin_run(T, sweep_workflow_id("prod"), deployment="prod")
    await store.finish(lease, WorkflowState.FINISHED)
    await age_workflow(backend, T, sweep_workflow_id("prod"), days=365)
    assert await store.list_prunable(T, ended_before=cutoff()) == []
    assert await store.prune_workflows(T, ended_before=cutoff()) == []
    assert await store.get_workflow(T, sweep_workflow_id("prod")) is not None


async def test_states_and_deployment_narrow_the_prune(backend: Backend) -> None:
    store = backend.open()
    await seed_workflow(store, T, "a-finished", deployment="prod")
    await seed_workflow(store, T, "b-failed", state=WorkflowState.FAILED, deployment="prod")
    await seed_workflow(store, T, "c-failed", state=WorkflowState.FAILED, deployment="staging")
    for wf in ("a-finished", "b-failed", "c-failed"):
        await age_workflow(backend, T, wf, days=60)

    failed = await store.list_prunable(T, ended_before=cutoff(), states=[WorkflowState.FAILED])
    assert [w.workflow_id for w in failed] == ["b-failed", "c-failed"]
    pruned = await store.prune_workflows(
        T, ended_before=cutoff(), states=["failed"], deployment="staging"
    )
    assert pruned == ["c-failed"]
    assert await rows_of(store, T, "a-finished") == WHOLE
    assert await rows_of(store, T, "b-failed") == WHOLE


async def test_the_cutoff_is_when_the_workflow_ended(store: DurableStore) -> None:
    """No aging behind the store's back: a workflow that ended before the cutoff goes,
    one that ended after it stays."""
    await seed_workflow(store, T, "first")
    await asyncio.sleep(0.02)
    between = datetime.now(UTC)
    await asyncio.sleep(0.02)
    await seed_workflow(store, T, "second")
    assert await store.prune_workflows(T, ended_before=between) == ["first"]
    assert await rows_of(store, T, "second") == WHOLE


async def test_tenants_are_apart(backend: Backend) -> None:
    store = backend.open()
    await seed_workflow(store, T, "wf")
    await seed_workflow(store, "org-other", "wf")
    await age_workflow(backend, T, "wf", days=40)
    await age_workflow(backend, "org-other", "wf", days=40)
    assert await store.prune_workflows(T, ended_before=cutoff()) == ["wf"]
    assert await rows_of(store, "org-other", "wf") == WHOLE


async def test_every_chat_the_workflow_names_loses_its_ledger(backend: Backend) -> None:
    """A tool call on a chat that has no journal row (a step's chat, the checkpoint's) is
    the workflow's too; another workflow's ledger stays."""
    store = backend.open()
    fence = await seed_workflow(store, T, "wf", state=None)
    await store.claim_tool(fence, "chat-unjournaled", "call-x", tool_name="refund")
    await store.save_checkpoint(fence, "chat-unjournaled", 3)
    await store.finish(fence, WorkflowState.FINISHED)
    await seed_workflow(store, T, "neighbour")
    await age_workflow(backend, T, "wf", days=40)

    assert await store.prune_workflows(T, ended_before=cutoff()) == ["wf"]
    assert await store.list_tools(T, "chat-unjournaled") == []
    assert await rows_of(store, T, "wf") == GONE
    assert await rows_of(store, T, "neighbour") == WHOLE


async def test_a_bad_cutoff_is_refused(store: DurableStore) -> None:
    with pytest.raises(CoderConfigError, match="time zone"):
        await store.prune_workflows(T, ended_before=datetime(2020, 1, 1))
    with pytest.raises(CoderConfigError, match="cannot prune"):
        await store.list_prunable(T, ended_before=cutoff(), states=["gone"])
    assert ENDED_STATES == (
        WorkflowState.FINISHED,
        WorkflowState.FAILED,
        WorkflowState.CANCELLED,
        WorkflowState.OVER_BUDGET,
    )


async def test_list_workflow_chats_reads_one_workflows_chats(store: DurableStore) -> None:
    fence = await store.begin_run(T, "wf")
    other = await store.begin_run(T, "other")
    for chat in ("c-2", "c-1"):
        await store.write_journal(
            fence, chat, JournalEntry(state="submitting", marker=f"m-{chat}", attempt=1)
        )
    await store.mark_discarded(other, "c-9")
    chats = await store.list_workflow_chats(T, "wf")
    assert [(c.chat_id, c.journal.marker if c.journal else None) for c in chats] == [
        ("c-1", "m-c-1"),
        ("c-2", "m-c-2"),
    ]
    assert [c.chat_id for c in await store.list_workflow_chats(T, "other")] == ["c-9"]
    assert await store.list_workflow_chats("org-other", "wf") == []


async def test_the_sql_itself_refuses_running_workflows(backend: Backend) -> None:
    """Past the rule's own check (a rule built by hand that names ``running``): the
    backend's SQL still takes no running workflow and no sweep record."""
    store = backend.open()
    assert isinstance(store, DurableStore)
    await seed_workflow(store, T, "old-running", state=None)
    lease = await store.begin_run(T, sweep_workflow_id("prod"))
    await store.finish(lease, WorkflowState.FINISHED)
    for wf in ("old-running", sweep_workflow_id("prod")):
        await age_workflow(backend, T, wf, days=400)
    rule = PruneRule(tenant=T, states=("running", "finished"), ended_before=cutoff())
    assert await store._read("prunable", lambda tx: tx.prunable(rule)) == []
    assert await store._write("prune", lambda tx: tx.prune(rule)) == []
    assert await rows_of(store, T, "old-running") == WHOLE
    assert await store.get_workflow(T, sweep_workflow_id("prod")) is not None
