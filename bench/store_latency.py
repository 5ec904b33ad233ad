"""What each durable write and a step's read cost, beside the floor: one bare commit on the
same database.

Run: ``python -m bench.store_latency [--n 400] [--dsn postgresql://…]``. For each store
(SQLite in a temporary file; Postgres in a throwaway schema, dropped afterwards) it
prints p50/p99 of

- every durable write, each one transaction (on Postgres one statement, one round trip):
  ``begin_run``, the fenced workflow writes (``save_checkpoint``, ``heartbeat``,
  ``finish``, ``clear_checkpoint``), ``complete_step``, the chat writes
  (``write_journal``, ``mark_discarded``) and the ledger's (``claim_tool`` won and lost,
  ``complete_tool``, and the claim + complete pair a durable tool makes: two commits);
- what a step reads before it acts: ``get_step_view``, one read, beside the separate
  reads it replaces (``get_step``, ``get_workflow``, ``get_chat``, and ``get_step`` of
  the step before when the chat has no journal entry);

and writes per second, sequential and from 8 concurrent writers (8 workflows, one store
instance, as one process runs it). The floor is measured on the same database in the
same run: SQLite, a bare ``sqlite3`` ``BEGIN IMMEDIATE; INSERT; COMMIT`` with the store's
pragmas (WAL, ``synchronous=FULL``: every commit flushed, as the store's flushed writes are;
its writes in ``UNFLUSHED`` commit with ``NORMAL``) on the store's own file; Postgres, a bare asyncpg
``INSERT`` in its own (implicit) transaction. Concurrent floors use 8 connections.

The machine is shared, so its drift is shared out: the calls (the floor among them) are
timed in rounds of 10 that rotate through them, and the load average is printed with the
numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from bench._common import drop_schema, load
from coder_chat.durable.base import UNFLUSHED
from coder_chat.durable.postgres import PostgresStore, redact_dsn
from coder_chat.durable.records import Fence, JournalEntry, StepRecord, WorkflowState
from coder_chat.durable.sqlite import BUSY_TIMEOUT_MS, SqliteStore
from coder_chat.durable.store import DurableStore
from coder_chat.errors import CoderStoreError

WRITERS = 8
WARMUP = 20
ROUND = 10
TENANT = "bench"
CHAT = "chat-0000"
FLOOR = "bare commit (the floor)"
#: About the size of a stored workflow record's JSON.
BODY = '{"tenant":"bench","workflow_id":"wf-0000","chat_id":"chat-0000"}' + " " * 250
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"

#: One timed call; ``i`` keeps each call's key its own where it must be.
Call = Callable[[int], Awaitable[object]]


@dataclass
class Latency:
    p50: float
    p99: float
    per_second: float  # sequential: calls / time spent in them


def summarize(samples: list[float]) -> Latency:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return Latency(statistics.median(ordered) * 1000, p99 * 1000, len(samples) / sum(samples))


async def rotate(calls: dict[str, Call], n: int) -> dict[str, Latency]:
    """``n`` timed calls of each, after ``WARMUP`` of each, in rounds of ``ROUND`` that rotate
    through them, so that what the machine does meanwhile falls on all of them alike."""
    for call in calls.values():
        for i in range(WARMUP):
            await call(-1 - i)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for start in range(0, n, ROUND):
        for name, call in calls.items():
            for i in range(start, min(n, start + ROUND)):
                t0 = time.perf_counter()
                await call(i)
                samples[name].append(time.perf_counter() - t0)
    return {name: summarize(taken) for name, taken in samples.items()}


# -- what is measured -------------------------------------------------------------------------


def durable_writes(store: DurableStore, fence: Fence) -> dict[str, Call]:
    """Every durable write of a running workflow (``fence``'s)."""

    async def tool_pair(i: int) -> None:
        call = f"pair-{i}"
        await store.claim_tool(fence, CHAT, call, tool_name="charge")
        await store.complete_tool(fence, CHAT, call, output={"receipt": i})

    step = StepRecord(
        tenant=fence.tenant,
        workflow_id=fence.workflow_id,
        step=1,
        chat_id=CHAT,
        last_seen_message_id=1,
        text=BODY,
        verdict="ran",
        prompt="the prompt of step 1",
    )
    entry = JournalEntry(state="submitting", marker="step-2", attempt=0)
    return {
        "begin_run": lambda i: store.begin_run(TENANT, f"wf-begin-{i}"),
        "save_checkpoint": lambda i: store.save_checkpoint(fence, CHAT, i),
        "heartbeat": lambda i: store.heartbeat(fence),
        "finish": lambda i: store.finish(fence, WorkflowState.RUNNING),
        "clear_checkpoint": lambda i: store.clear_checkpoint(fence),
        "complete_step": lambda i: store.complete_step(fence, step),
        "write_journal": lambda i: store.write_journal(fence, CHAT, entry),
        "mark_discarded": lambda i: store.mark_discarded(fence, f"chat-{i}"),
        "claim_tool (won)": lambda i: store.claim_tool(fence, CHAT, f"won-{i}", tool_name="t"),
        "claim_tool (lost)": lambda i: store.claim_tool(fence, CHAT, "held", tool_name="t"),
        "complete_tool": lambda i: store.complete_tool(fence, CHAT, "held", output={"n": i}),
        "claim_tool + complete_tool": tool_pair,
    }


#: Commits each write makes (the rest make one): its floor is that many bare commits.
COMMITS = {"claim_tool + complete_tool": 2}


def step_reads(store: DurableStore, fence: Fence) -> dict[str, Call]:
    """Step 2's reads on the chat step 1 finished on: the one read, and those it replaces."""
    tenant, workflow_id = fence.tenant, fence.workflow_id

    async def three(i: int) -> None:
        await store.get_step(tenant, workflow_id, 2)
        await store.get_workflow(tenant, workflow_id)
        await store.get_chat(tenant, CHAT)

    async def four(i: int) -> None:
        await three(i)
        await store.get_step(tenant, workflow_id, 1)

    return {
        "get_step_view (one read)": lambda i: store.get_step_view(tenant, workflow_id, 2),
        "get_step + get_workflow + get_chat": three,
        "  + get_step of the step before": four,
    }


@dataclass
class StoreNumbers:
    #: Each durable write by name, and the floor (``FLOOR``), measured together.
    writes: dict[str, Latency]
    #: What a step reads before it acts: the one read, and the reads it replaces.
    reads: dict[str, Latency]
    concurrent_per_second: float
    floor_concurrent_per_second: float


async def measure(
    store: DurableStore, floor: Call, floor_concurrent: Callable[[int], Awaitable[float]], n: int
) -> StoreNumbers:
    fence = await store.begin_run(TENANT, "wf-seq")
    await store.claim_tool(fence, CHAT, "held", tool_name="t")
    writes = await rotate({**durable_writes(store, fence), FLOOR: floor}, n)

    # The state a step 2 finds: step 1 finished on CHAT, CHAT checkpointed and journaled.
    await store.complete_step(
        fence,
        StepRecord(
            tenant=TENANT, workflow_id="wf-seq", step=1, chat_id=CHAT, text="", verdict="ran"
        ),
    )
    await store.write_journal(fence, CHAT, JournalEntry(state="submitting", marker="m", attempt=0))
    reads = await rotate(step_reads(store, fence), n)

    fences = [await store.begin_run(TENANT, f"wf-{w}") for w in range(WRITERS)]
    per_writer = max(1, n // WRITERS) * 2

    async def writer(f: Fence) -> None:
        for i in range(per_writer):
            await store.save_checkpoint(f, CHAT, i)

    started = time.perf_counter()
    await asyncio.gather(*(writer(f) for f in fences))
    concurrent = WRITERS * per_writer / (time.perf_counter() - started)
    return StoreNumbers(writes, reads, concurrent, await floor_concurrent(per_writer))


# -- the stores and their floors -------------------------------------------------------------


def sqlite_connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def sqlite_commit(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO bench_floor (body) VALUES (?)", (BODY,))
    conn.execute("COMMIT")


def sqlite_concurrent(path: Path, per_writer: int) -> float:
    barrier = threading.Barrier(WRITERS + 1)

    def writer() -> None:
        own = sqlite_connect(path)
        barrier.wait()
        for _ in range(per_writer):
            sqlite_commit(own)
        own.close()

    threads = [threading.Thread(target=writer) for _ in range(WRITERS)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return WRITERS * per_writer / (time.perf_counter() - started)


async def bench_sqlite(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="prefect-coder-bench-") as tmp:
        path = Path(tmp) / "store.db"
        store = SqliteStore(path)
        await store.store_id()  # the file exists, ours
        conn = sqlite_connect(path)  # the floor: same file, in this thread, no hop
        conn.execute("CREATE TABLE bench_floor (id INTEGER PRIMARY KEY, body TEXT)")

        async def floor(i: int) -> None:
            sqlite_commit(conn)

        async def floor_concurrent(per_writer: int) -> float:
            return await asyncio.to_thread(sqlite_concurrent, path, per_writer)

        try:
            ours = await measure(store, floor, floor_concurrent, n)
        finally:
            conn.close()
            await store.close()
    where = f"a file under {tempfile.gettempdir()}"
    report(f"sqlite (WAL; {', '.join(sorted(UNFLUSHED))} not flushed; {where})", ours)


async def bench_postgres(dsn: str, n: int) -> None:
    schema = f"prefect_coder_bench_{uuid.uuid4().hex[:12]}"
    table = f'"{schema}".bench_floor'
    insert = f"INSERT INTO {table} (body) VALUES ($1)"
    store = PostgresStore(dsn, schema=schema, max_size=10)
    try:
        try:
            await store.store_id()  # the schema exists
        except CoderStoreError as exc:
            print(f"\npostgres: skipped ({exc})")
            return
        conn = await asyncpg.connect(dsn)  # the floor: one statement on one connection
        pool = await asyncpg.create_pool(dsn, min_size=WRITERS, max_size=WRITERS)
        try:
            await conn.execute(f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, body JSONB)")

            async def floor(i: int) -> None:
                await conn.execute(insert, BODY)

            async def floor_concurrent(per_writer: int) -> float:
                async def writer() -> None:
                    async with pool.acquire() as own:
                        for _ in range(per_writer):
                            await own.execute(insert, BODY)

                started = time.perf_counter()
                await asyncio.gather(*(writer() for _ in range(WRITERS)))
                return WRITERS * per_writer / (time.perf_counter() - started)

            ours = await measure(store, floor, floor_concurrent, n)
        finally:
            await conn.close()
            await pool.close()
            await store.close()
        version = await _server_version(dsn)
        report(f"postgres {version} at {redact_dsn(dsn)}", ours)
    finally:
        await drop_schema(dsn, schema)


async def _server_version(dsn: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        return str(await conn.fetchval("SHOW server_version")).split()[0]
    finally:
        await conn.close()


# -- report -----------------------------------------------------------------------------------


def report(name: str, ours: StoreNumbers) -> None:
    floor = ours.writes[FLOOR]
    print(f"\n{name}")
    print(f"  {'one durable write':<34} {'p50 ms':>8} {'p99 ms':>8} {'floor p50':>10} {'ratio':>6}")
    for label, lat in ours.writes.items():
        if label == FLOOR:
            continue
        commits = COMMITS.get(label, 1)
        floor_label = f"{floor.p50:.3f}" + (f"x{commits}" if commits > 1 else "")
        print(
            f"  {label:<34} {lat.p50:>8.3f} {lat.p99:>8.3f} {floor_label:>10} "
            f"{lat.p50 / (commits * floor.p50):>6.2f}"
        )
    print(f"  {FLOOR:<34} {floor.p50:>8.3f} {floor.p99:>8.3f}")
    print(f"  {'what a step reads before it acts':<34} {'p50 ms':>8} {'p99 ms':>8}")
    for label, lat in ours.reads.items():
        print(f"  {label:<34} {lat.p50:>8.3f} {lat.p99:>8.3f}")
    print(f"  {'writes per second':<34} {'store':>8} {'floor':>8} {'':>10} {'ratio':>6}")
    for label, mine, base in [
        (
            "sequential (save_checkpoint)",
            ours.writes["save_checkpoint"].per_second,
            floor.per_second,
        ),
        (
            f"{WRITERS} concurrent writers",
            ours.concurrent_per_second,
            ours.floor_concurrent_per_second,
        ),
    ]:
        print(f"  {label:<34} {mine:>8,.0f} {base:>8,.0f} {'':>10} {mine / base:>6.2f}")


async def run(n: int, dsn: str) -> None:
    print(f"store latency: {n} sequential calls per measurement after {WARMUP} warm-up, in")
    print(f"rounds of {ROUND} rotating through them; {WRITERS} concurrent writers share one store")
    print(f"instance (one process). At start: {load()}")
    await bench_sqlite(n)
    await bench_postgres(dsn, n)
    print(f"\nat end: {load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="calls per measurement")
    parser.add_argument(
        "--dsn",
        default=os.environ.get("PREFECT_CODER_TEST_POSTGRES_DSN") or DEFAULT_DSN,
        help="Postgres to measure (a throwaway schema is created and dropped)",
    )
    args = parser.parse_args()
    asyncio.run(run(args.n, args.dsn))


if __name__ == "__main__":
    main()
