"""``get_step_view``: what a step reads before it acts, in one read, on both stores.

It must answer exactly what the separate reads it replaces would (the step, the workflow,
the checkpointed chat's journal, the chat the previous step finished on and where). Every test with
``backend``/``store`` runs on SQLite and Postgres (see conftest); the round trips it costs
on Postgres are counted in ``test_postgres_round_trips.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from coder_chat.durable.records import JournalEntry, StepView
from coder_chat.durable.store import DurableStore
from coder_chat.errors import CoderStoreError

from .backends import Backend, insert_malformed_workflow, step_record

T = "org-1"


def journal(marker: str, attempt: int = 0) -> JournalEntry:
    return JournalEntry(state="submitting", marker=marker, attempt=attempt)


async def separate_reads(store: DurableStore, tenant: str, workflow_id: str, step: int) -> StepView:
    """The view as the reads it replaces see it, one by one."""
    workflow = await store.get_workflow(tenant, workflow_id)
    chat_id = workflow.chat_id if workflow else None
    chat = await store.get_chat(tenant, chat_id) if chat_id else None
    previous = await store.get_step(tenant, workflow_id, step - 1) if step > 1 else None
    return StepView(
        step=await store.get_step(tenant, workflow_id, step),
        workflow=workflow,
        journal=chat.journal if chat else None,
        previous_chat_id=previous.chat_id if previous else None,
        previous_cursor=previous.last_seen_message_id if previous else None,
    )


async def test_a_workflow_that_never_began(store: DurableStore) -> None:
    assert await store.get_step_view(T, "wf", 1) == StepView()
    assert await store.get_step_view(T, "wf", 3) == StepView()


async def test_a_first_step_before_anything_was_written(store: DurableStore) -> None:
    fence = await store.begin_run(T, "wf")
    view = await store.get_step_view(T, "wf", 1)
    assert view.workflow == await store.get_workflow(T, "wf")
    assert view.workflow is not None and view.workflow.epoch == fence.epoch
    assert (view.step, view.journal, view.previous_chat_id) == (None, None, None)


async def test_the_checkpointed_chats_journal_and_no_other(store: DurableStore) -> None:
    fence = await store.begin_run(T, "wf")
    await store.write_journal(fence, "chat-old", journal("step-0"))
    await store.save_checkpoint(fence, "chat-1", 7)
    assert (await store.get_step_view(T, "wf", 1)).journal is None  # chat-1 has none yet

    entry = journal("step-1", 2)
    await store.write_journal(fence, "chat-1", entry)
    view = await store.get_step_view(T, "wf", 1)
    assert view.journal == entry
    assert view.workflow is not None
    assert (view.workflow.chat_id, view.workflow.last_seen_message_id) == ("chat-1", 7)

    await store.clear_checkpoint(fence)  # no checkpoint: no journal, whatever the chats hold
    assert (await store.get_step_view(T, "wf", 1)).journal is None


async def test_a_finished_step_and_the_chat_of_the_one_before(store: DurableStore) -> None:
    fence = await store.begin_run(T, "wf")
    first = step_record(fence, 1, chat_id="chat-a", prompt="first prompt")
    await store.complete_step(fence, first)
    await store.complete_step(fence, step_record(fence, 2, chat_id="chat-b"))

    one = await store.get_step_view(T, "wf", 1)
    assert (one.step, one.previous_chat_id) == (first, None)  # step 1 has no step before
    two = await store.get_step_view(T, "wf", 2)
    assert two.step is not None and two.step.chat_id == "chat-b"
    assert (two.previous_chat_id, two.previous_cursor) == ("chat-a", 11)  # where step 1 ended
    three = await store.get_step_view(T, "wf", 3)
    assert (three.step, three.previous_chat_id, three.previous_cursor) == (None, "chat-b", 12)
    assert three.workflow is not None and three.workflow.chat_id == "chat-b"  # step 2's checkpoint
    assert (await store.get_step_view(T, "wf", 5)).previous_chat_id is None  # step 4 never ran


async def test_it_answers_what_the_separate_reads_answer(store: DurableStore) -> None:
    fence = await store.begin_run(T, "wf", deployment="prod", flow_run_id="run-1")
    await store.complete_step(fence, step_record(fence, 1, chat_id="chat-1"))
    await store.write_journal(fence, "chat-1", journal("step-2", 1))
    await store.write_journal(fence, "chat-2", journal("step-9"))
    await store.save_checkpoint(fence, "chat-1", 21)
    for step in range(4):
        assert await store.get_step_view(T, "wf", step) == await separate_reads(
            store, T, "wf", step
        ), step
    second = await store.begin_run(T, "wf")  # a later run sees the same, at its own epoch
    view = await store.get_step_view(T, "wf", 2)
    assert view == await separate_reads(store, T, "wf", 2)
    assert view.workflow is not None and view.workflow.epoch == second.epoch == 2


async def test_tenants_and_workflows_are_apart(store: DurableStore) -> None:
    a = await store.begin_run("org-a", "wf")
    other = await store.begin_run("org-a", "wf-other")
    await store.complete_step(a, step_record(a, 1, chat_id="chat-a"))
    await store.write_journal(a, "chat-a", journal("step-2"))
    await store.complete_step(other, step_record(other, 1, chat_id="chat-o"))
    b = await store.begin_run("org-b", "wf")
    await store.save_checkpoint(b, "chat-a", 1)  # the same chat id, under another tenant

    seen_b = await store.get_step_view("org-b", "wf", 2)
    assert (seen_b.step, seen_b.journal, seen_b.previous_chat_id) == (None, None, None)
    assert seen_b.workflow is not None and seen_b.workflow.tenant == "org-b"
    seen_a = await store.get_step_view("org-a", "wf", 2)
    assert seen_a.previous_chat_id == "chat-a" and seen_a.journal is not None
    assert await store.get_step_view("org-c", "wf", 2) == StepView()


async def test_it_is_a_read(store: DurableStore) -> None:
    fence = await store.begin_run(T, "wf")
    await store.complete_step(fence, step_record(fence, 1))
    commits = store.commits
    await store.get_step_view(T, "wf", 2)
    assert store.commits == commits


async def test_malformed_rows_are_reported(backend: Backend) -> None:
    store = backend.open()
    fence = await store.begin_run(T, "wf")
    await store.save_checkpoint(fence, "chat-bad", 1)
    await backend.execute(
        "INSERT INTO chats (tenant, chat_id, workflow_id, discarded, body) "
        "VALUES (?, 'chat-bad', 'wf', 0, ?)",
        "INSERT INTO {s}.chats (tenant, chat_id, workflow_id, discarded, body) "
        "VALUES ($1, 'chat-bad', 'wf', false, $2::jsonb)",
        T,
        '{"tenant": "org-1", "chat_id": 5}',
    )
    with pytest.raises(CoderStoreError, match="malformed row in chats"):
        await store.get_step_view(T, "wf", 1)
    await insert_malformed_workflow(backend, T)
    with pytest.raises(CoderStoreError, match="malformed row in workflows") as info:
        await store.get_step_view(T, "bad", 1)
    assert info.value.retryable is False


async def test_a_view_never_mixes_two_moments(backend: Backend) -> None:
    """A writer finishes steps 1, 2, 3… (step n leaves the cursor at n) while a reader
    views them through another store object. From one snapshot, step k is finished exactly
    when the cursor has reached k, and step k - 1 exactly when it has reached k - 1;
    reads taken one after another would see the two at different moments."""
    writer, reader = backend.open(), backend.open()
    fence = await writer.begin_run(T, "wf")
    await reader.get_workflow(T, "wf")
    steps = 30
    seen: list[tuple[int, StepView]] = []
    viewed = asyncio.Event()

    async def write() -> None:
        for n in range(1, steps + 1):
            await writer.complete_step(
                fence, step_record(fence, n, chat_id=f"chat-{n}", last_seen_message_id=n)
            )
            # Let the reader take at least one view per step, whatever the machine's
            # speed, so reads and writes interleave for the whole run.
            while len(seen) < n:
                viewed.clear()
                await viewed.wait()

    async def read() -> None:
        cursor = 0
        while cursor < steps:
            # Alternately the step last seen finished, and the one being written now.
            k = min(steps, cursor + len(seen) % 2) or 1
            view = await reader.get_step_view(T, "wf", k)
            seen.append((k, view))
            viewed.set()
            assert view.workflow is not None
            cursor = view.workflow.last_seen_message_id or 0

    await asyncio.gather(write(), read())
    assert len(seen) >= steps
    for k, view in seen:
        assert view.workflow is not None
        cursor = view.workflow.last_seen_message_id or 0
        assert (view.step is not None) == (cursor >= k), (k, cursor)
        assert (view.previous_chat_id is not None) == (k > 1 and cursor >= k - 1), (k, cursor)
        if view.previous_chat_id is not None:
            assert view.previous_chat_id == f"chat-{k - 1}"
