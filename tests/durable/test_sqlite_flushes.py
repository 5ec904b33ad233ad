"""Which SQLite writes wait for the disk: fsyncs counted by ``strace`` on a real process.

A write that keeps an effect from being repeated (the journal entry before a send, a
tool's claim before its effect) is flushed before it returns; a finished step, a
checkpoint and a heartbeat are committed without waiting for the disk (a killed process
keeps them all the same; see ``UNFLUSHED``); writes made at once share a commit and its
flush. The worker marks each kind of write with a syscall of its own, and the trace is
split at those marks.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from coder_chat.durable.records import Fence, JournalEntry, StepRecord, WorkflowRecord
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.store import FencedOut

from .backends import ROOT

COUNT = 12
_MARK = re.compile(r'access\("/@@phase-([a-z_]+)"')
_SYNC = re.compile(r"\b(fsync|fdatasync)\(")


def fsyncs_by_phase(trace: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    phase = "open"
    for line in trace.splitlines():
        if mark := _MARK.search(line):
            phase = mark.group(1)
            counts.setdefault(phase, 0)
        elif _SYNC.search(line):
            counts[phase] = counts.get(phase, 0) + 1
    return counts


def begun(path: Path, workflow_id: str) -> Fence:
    async def begin() -> Fence:
        store = SqliteStore(path)
        try:
            return await store.begin_run("org-1", workflow_id)
        finally:
            await store.close()

    return asyncio.run(begin())


def read_back(path: Path, workflow_id: str) -> tuple[list[StepRecord], WorkflowRecord | None]:
    async def read() -> tuple[list[StepRecord], WorkflowRecord | None]:
        store = SqliteStore(path)
        try:
            steps = await store.list_steps("org-1", workflow_id)
            return steps, await store.get_workflow("org-1", workflow_id)
        finally:
            await store.close()

    return asyncio.run(read())


def worker_command(path: Path, fence: Fence, count: int) -> list[str]:
    return [
        *(sys.executable, "-m", "tests.durable._worker", "sqlite", str(path), "phases"),
        *(fence.tenant, fence.workflow_id, str(fence.epoch), str(count)),
    ]


@pytest.fixture
def strace() -> str:
    found = shutil.which("strace")
    assert found, "strace is needed to count fsyncs (.ci/run installs it)"
    return found


def test_only_writes_that_guard_an_effect_wait_for_the_disk(tmp_path: Path, strace: str) -> None:
    path = tmp_path / "ledger.sqlite3"
    fence = begun(path, "wf-flush")
    trace = tmp_path / "trace.txt"
    watched = "trace=fsync,fdatasync,access,faccessat,faccessat2"
    done = subprocess.run(
        [strace, "-f", "-qq", "-e", watched, "-o", str(trace), *worker_command(path, fence, COUNT)],
        cwd=ROOT,
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    counts = fsyncs_by_phase(trace.read_text())
    assert counts.get("write_journal", 0) >= COUNT, counts
    assert counts.get("claim_tool", 0) >= COUNT, counts
    assert counts.get("heartbeat") == 0, counts
    assert counts.get("complete_step") == 0, counts
    # COUNT journal entries written at once: they wait for each other's flush, not
    # each for its own (the first may commit alone, before the others are queued).
    assert 1 <= counts.get("together", 0) <= COUNT // 2, counts
    # The store's own count says the same: 5 phases of COUNT writes, 3 of them flushed,
    # and the worker's opening write.
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "commits": 5 * COUNT + 1,
        "flushes": 3 * COUNT + 1,
    }


def test_unflushed_writes_are_read_back_after_the_process_is_killed(tmp_path: Path) -> None:
    """A heartbeat and a finished step are committed, not merely buffered: a process
    killed right after them leaves them to the next one."""
    path = tmp_path / "ledger.sqlite3"
    fence = begun(path, "wf-kill")
    worker = subprocess.Popen(
        worker_command(path, fence, 3),
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    line = worker.stdout.readline()  # every write made; the worker has not closed yet
    worker.kill()
    worker.wait(timeout=30)
    assert json.loads(line)["commits"] == 5 * 3 + 1
    steps, workflow = read_back(path, "wf-kill")
    assert [s.step for s in steps] == [1, 2, 3]
    assert workflow is not None and workflow.heartbeat_at is not None
    assert workflow.chat_id == "chat-p" and workflow.last_seen_message_id == 2


async def test_writes_committed_together_fail_alone(tmp_path: Path) -> None:
    """Writes made at once share a transaction; one fenced out is undone alone, and the
    others are committed as if each had been alone."""
    store = SqliteStore(tmp_path / "ledger.sqlite3")
    try:
        stale = await store.begin_run("org-1", "wf-group")
        fence = await store.begin_run("org-1", "wf-group")  # takes epoch 2 from ``stale``

        async def journal(which: Fence, n: int) -> None:
            entry = JournalEntry(state="submitting", marker=f"m-{which.epoch}-{n}", attempt=0)
            await store.write_journal(which, f"chat-{which.epoch}-{n}", entry)

        writes = [journal(fence if n % 2 else stale, n) for n in range(20)]
        outcomes = await asyncio.gather(*writes, return_exceptions=True)
        for n, outcome in enumerate(outcomes):
            if n % 2:
                assert outcome is None, (n, outcome)
            else:
                assert isinstance(outcome, FencedOut) and outcome.current == 2, (n, outcome)
        chats = {c.chat_id: c for c in await store.list_chats("org-1")}
    finally:
        await store.close()
    assert sorted(chats) == sorted(f"chat-2-{n}" for n in range(1, 20, 2))
    assert all(
        c.journal is not None and c.journal.marker == f"m-{c.chat_id[5:]}" for c in chats.values()
    )


async def test_a_write_cancelled_before_the_store_took_it_is_never_made(tmp_path: Path) -> None:
    """Another connection holds the file's write lock, so the store's thread waits on a first
    write; a second, queued behind it, is cancelled there. Once the lock is released the
    first commits, and the second, whose caller saw it cancelled, is never made."""
    path = tmp_path / "ledger.sqlite3"
    store = SqliteStore(path)
    try:
        fence = await store.begin_run("org-1", "wf-cancel")
        entry = JournalEntry(state="submitting", marker="m-1", attempt=0)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        first = asyncio.create_task(store.write_journal(fence, "chat-first", entry))
        await asyncio.sleep(0.3)  # the store's thread now waits for the lock
        second = asyncio.create_task(store.write_journal(fence, "chat-second", entry))
        await asyncio.sleep(0.1)
        second.cancel()
        holder.execute("COMMIT")
        holder.close()
        await first
        with pytest.raises(asyncio.CancelledError):
            await second
        chats = [c.chat_id for c in await store.list_chats("org-1")]
    finally:
        await store.close()
    assert chats == ["chat-first"]
