"""Schema versions 2 and 3 on both stores: finished steps (with their prompt), the store id,
archive_at_end, commits.

Every test with ``backend``/``store`` runs on SQLite and Postgres (see conftest).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

import pytest

from coder_chat.durable.records import JournalEntry, StepRecord, WorkflowState
from coder_chat.durable.sqlite import run_now
from coder_chat.durable.store import DurableStore, FencedOut
from coder_chat.errors import CoderConfigError, CoderStoreError

from .backends import Backend, step_record

T = "org-1"
JOURNAL = JournalEntry(state="submitting", marker="step-1", attempt=1)


# -- finished steps --------------------------------------------------------------------------


async def test_complete_step_writes_the_step_and_its_checkpoint(store: DurableStore) -> None:
    fence = await store.begin_run(T, "wf")
    assert await store.get_step(T, "wf", 1) is None
    output = {"answer": 42, "items": [1.5, None, "é ✓ 𝄞"], "nested": {"z": [], "a": {}}}
    record = step_record(
        fence,
        1,
        chat_id="chat-7",
        last_seen_message_id=77,
        text='the "answer"\n',
        output=output,
        verdict="recovered",
        prompt='what is the "answer"?\n é ✓ 𝄞',
        prompt_digest="ab" * 32,
        notes=["interrupted a running turn", "adopted the finished reply"],
    )
    await store.complete_step(fence, record)

    assert await store.get_step(T, "wf", 1) == record  # field for field
    workflow = await store.get_workflow(T, "wf")
    assert workflow is not None
    assert (workflow.chat_id, workflow.last_seen_message_id) == ("chat-7", 77)
    assert (workflow.epoch, workflow.state) == (1, WorkflowState.RUNNING)

    # A step finishing with no message seen leaves that checkpoint too.
    await store.complete_step(
        fence, step_record(fence, 2, chat_id="chat-8", last_seen_message_id=None)
    )
    workflow = await store.get_workflow(T, "wf")
    assert workflow is not None
    assert (workflow.chat_id, workflow.last_seen_message_id) == ("chat-8", None)


async def test_complete_step_replaces_a_step_written_before(store: DurableStore) -> None:
    first = await store.begin_run(T, "wf")
    await store.complete_step(first, step_record(first, 1, text="first try"))
    second = await store.begin_run(T, "wf")
    again = step_record(second, 1, text="second try", chat_id="chat-2", verdict="resubmitted")
    await store.complete_step(second, again)
    assert await store.get_step(T, "wf", 1) == again
    assert await store.list_steps(T, "wf") == [again]


async def test_list_steps_by_step_number(store: DurableStore) -> None:
    fence = await store.begin_run(T, "wf")
    other = await store.begin_run(T, "wf-other")
    for step in [3, 10, 1, 2]:  # 10 after 3: numbers, not strings
        await store.complete_step(fence, step_record(fence, step))
    await store.complete_step(other, step_record(other, 5))
    assert [s.step for s in await store.list_steps(T, "wf")] == [1, 2, 3, 10]
    assert [s.step for s in await store.list_steps(T, "wf-other")] == [5]
    assert await store.list_steps(T, "wf-none") == []
    assert await store.get_step(T, "wf", 4) is None
    assert await store.get_step(T, "wf-other", 1) is None
    latest = await store.get_workflow(T, "wf")
    assert latest is not None and latest.last_seen_message_id == 12  # the last one written


async def test_steps_of_tenants_are_apart(store: DurableStore) -> None:
    a = await store.begin_run("org-a", "wf")
    b = await store.begin_run("org-b", "wf")
    step_a, step_b = step_record(a, 1, text="for a"), step_record(b, 1, text="for b")
    await store.complete_step(a, step_a)
    await store.complete_step(b, step_b)
    assert await store.get_step("org-a", "wf", 1) == step_a
    assert await store.get_step("org-b", "wf", 1) == step_b
    assert await store.list_steps("org-a", "wf") == [step_a]
    assert await store.list_steps("org-b", "wf") == [step_b]
    assert await store.list_steps("org-c", "wf") == []
    assert await store.get_step("org-c", "wf", 1) is None


async def test_a_step_of_another_workflow_is_refused(store: DurableStore) -> None:
    fence = await store.begin_run(T, "wf")
    other = await store.begin_run(T, "wf-2")
    for wrong in (step_record(other, 1), step_record(fence, 1, tenant="org-other")):
        with pytest.raises(CoderConfigError, match="cannot be completed"):
            await store.complete_step(fence, wrong)
    assert await store.list_steps(T, "wf") == await store.list_steps(T, "wf-2") == []
    workflow = await store.get_workflow(T, "wf")
    assert workflow is not None and workflow.chat_id is None


async def test_a_step_that_cannot_be_written_leaves_no_checkpoint(backend: Backend) -> None:
    """One transaction: when the step's row is refused, the checkpoint is not written either."""
    store = backend.open()
    fence = await store.begin_run(T, "wf")
    await store.complete_step(fence, step_record(fence, 1, chat_id="chat-1"))
    await backend.execute(
        "CREATE TRIGGER refuse_steps BEFORE INSERT ON steps "
        "BEGIN SELECT RAISE(ABORT, 'steps refused by a test'); END",
        "CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'steps refused by a test'; END $$; "
        "CREATE TRIGGER refuse_steps BEFORE INSERT OR UPDATE ON {s}.steps "
        "FOR EACH ROW EXECUTE FUNCTION {s}.refuse()",
    )
    before, commits = await store.get_workflow(T, "wf"), store.commits
    with pytest.raises(CoderStoreError, match="complete_step failed") as info:
        await store.complete_step(fence, step_record(fence, 2, chat_id="chat-2"))
    assert "steps refused by a test" in str(info.value)
    assert not isinstance(info.value, FencedOut)
    assert await store.get_workflow(T, "wf") == before  # checkpoint still (chat-1, 11)
    assert [s.step for s in await store.list_steps(T, "wf")] == [1]
    assert store.commits == commits


async def test_a_malformed_step_row_is_reported(backend: Backend) -> None:
    store = backend.open()
    fence = await store.begin_run(T, "wf")
    await store.complete_step(fence, step_record(fence, 1))
    await backend.execute(
        "INSERT INTO steps (tenant, workflow_id, step, chat_id, body) "
        "VALUES (?, 'wf', 2, 'chat-1', ?)",
        "INSERT INTO {s}.steps (tenant, workflow_id, step, chat_id, body) "
        "VALUES ($1, 'wf', 2, 'chat-1', $2::jsonb)",
        T,
        '{"tenant": "org-1", "step": "two"}',
    )
    for read in (lambda: store.get_step(T, "wf", 2), lambda: store.list_steps(T, "wf")):
        with pytest.raises(CoderStoreError, match="malformed row in steps") as info:
            await read()
        assert info.value.retryable is False
    assert await store.get_step(T, "wf", 1) is not None


# -- archive_at_end ---------------------------------------------------------------------------


async def test_archive_at_end_is_kept_with_the_workflow(store: DurableStore) -> None:
    await store.begin_run(T, "keep", archive_at_end=False)
    await store.begin_run(T, "archive")
    kept, archived = await store.get_workflow(T, "keep"), await store.get_workflow(T, "archive")
    assert kept is not None and archived is not None
    assert (kept.archive_at_end, archived.archive_at_end) == (False, True)
    listed = {w.workflow_id: w.archive_at_end for w in await store.list_workflows(T)}
    assert listed == {"keep": False, "archive": True}

    fence = await store.begin_run(T, "keep", archive_at_end=False)  # each run says it again
    await store.finish(fence, WorkflowState.FINISHED)  # and the fenced writes keep it
    kept = await store.get_workflow(T, "keep")
    assert kept is not None and kept.archive_at_end is False
    await store.begin_run(T, "keep")
    kept = await store.get_workflow(T, "keep")
    assert kept is not None and kept.archive_at_end is True


# -- the store id -----------------------------------------------------------------------------


async def test_store_id_is_made_once_and_shared_by_every_opener(backend: Backend) -> None:
    store = backend.open()
    store_id = await store.store_id()
    assert re.fullmatch(r"[0-9a-f]{12}4[0-9a-f]{19}", store_id)  # a uuid4, as hex
    assert await store.store_id() == store_id
    assert await backend.open().store_id() == store_id  # another instance, another connection
    await store.close()
    assert await backend.open().store_id() == store_id  # reopened

    worker = backend.worker("store-id")  # another process
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0
    assert out.strip() == store_id


async def test_two_stores_never_share_an_id(backend: Backend) -> None:
    ids = [await backend.open().store_id()]
    for tag in ("b", "c"):
        ids.append(await backend.sibling(tag).open().store_id())
    assert len(set(ids)) == 3


async def test_store_id_is_read_once_per_store_object(backend: Backend) -> None:
    store = backend.open()
    store_id = await store.store_id()
    await backend.execute(
        "UPDATE meta SET value = 'changed' WHERE key = 'store_id'",
        "UPDATE {s}.meta SET value = 'changed' WHERE key = 'store_id'",
    )
    assert await store.store_id() == store_id  # cached: this object never reads it again
    assert await backend.open().store_id() == "changed"  # a new one reads the store
    assert store.commits == 0


async def test_concurrent_first_use_makes_one_store_id(backend: Backend) -> None:
    for round_ in range(4):
        fresh = backend.sibling(f"id{round_}")
        stores = [fresh.open() for _ in range(6)]
        ids = await asyncio.gather(*(s.store_id() for s in stores))
        assert len(set(ids)) == 1


# -- the commit counter ------------------------------------------------------------------------

Call = Callable[[], Awaitable[object]]


async def test_every_write_counts_one_commit_and_reads_none(store: DurableStore) -> None:
    assert store.commits == 0
    fence = await store.begin_run(T, "wf")
    assert store.commits == 1
    writes: list[tuple[str, Call]] = [
        ("save_checkpoint", lambda: store.save_checkpoint(fence, "chat-1", 1)),
        ("heartbeat", lambda: store.heartbeat(fence)),
        ("write_journal", lambda: store.write_journal(fence, "chat-1", JOURNAL)),
        ("mark_discarded", lambda: store.mark_discarded(fence, "chat-1")),
        ("claim_tool (won)", lambda: store.claim_tool(fence, "chat-1", "c", tool_name="t")),
        ("claim_tool (lost)", lambda: store.claim_tool(fence, "chat-1", "c", tool_name="t")),
        ("complete_tool", lambda: store.complete_tool(fence, "chat-1", "c", output=1)),
        ("complete_step", lambda: store.complete_step(fence, step_record(fence, 1))),
        ("clear_checkpoint", lambda: store.clear_checkpoint(fence)),
        ("finish", lambda: store.finish(fence, WorkflowState.FINISHED)),
        ("begin_run", lambda: store.begin_run(T, "wf")),
    ]
    for name, write in writes:
        before = store.commits
        await write()
        assert store.commits == before + 1, name

    reads: list[Call] = [
        store.store_id,
        lambda: store.get_workflow(T, "wf"),
        lambda: store.list_workflows(T, states=[WorkflowState.RUNNING]),
        lambda: store.get_chat(T, "chat-1"),
        lambda: store.list_chats(T),
        lambda: store.get_tool(T, "chat-1", "c"),
        lambda: store.list_tools(T, "chat-1"),
        lambda: store.get_step(T, "wf", 1),
        lambda: store.list_steps(T, "wf"),
    ]
    before = store.commits
    for read in reads:
        await read()
    assert store.commits == before == 1 + len(writes)


async def test_writes_that_fail_count_no_commit(store: DurableStore) -> None:
    old = await store.begin_run(T, "wf")
    await store.begin_run(T, "wf")
    assert store.commits == 2
    with pytest.raises(FencedOut):
        await store.complete_step(old, step_record(old, 1))
    with pytest.raises(FencedOut):
        await store.claim_tool(old, "chat-1", "c", tool_name="t")
    new = await store.begin_run(T, "wf")
    with pytest.raises(CoderStoreError, match="no ledger entry"):
        await store.complete_tool(new, "chat-1", "missing", output=1)
    assert store.commits == 3


async def test_commits_are_counted_per_store_object_and_exactly_across_loops(
    backend: Backend,
) -> None:
    first, second = backend.open(), backend.open()
    fence = await first.begin_run(T, "wf")
    per_loop = 25

    def on_a_new_loop(n: int) -> None:
        async def beat() -> None:
            for _ in range(per_loop):
                await first.heartbeat(fence)

        asyncio.run(beat())

    await asyncio.gather(*(asyncio.to_thread(on_a_new_loop, n) for n in range(4)))
    await asyncio.gather(*(first.save_checkpoint(fence, "chat", i) for i in range(per_loop)))
    assert first.commits == 1 + 5 * per_loop
    assert second.commits == 0  # its own count: what this object committed
    await second.heartbeat(fence)
    assert (first.commits, second.commits) == (1 + 5 * per_loop, 1)


# -- SQLite's driver ---------------------------------------------------------------------------


def test_a_sqlite_operation_that_suspends_is_refused() -> None:
    async def suspends() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspended"):
        run_now(suspends())

    async def answers() -> StepRecord | None:
        return None

    assert run_now(answers()) is None
