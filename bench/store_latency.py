"""What one durable write costs, beside the floor: one bare commit on the same database.

Run: ``python -m bench.store_latency [--n 400] [--dsn postgresql://…]``. For each store
(SQLite in a temporary file; Postgres in a throwaway schema, dropped afterwards) it
prints p50/p99 of

- a fenced ``save_checkpoint`` (one transaction: check the epoch, write the row), and
- a ``claim_tool`` + ``complete_tool`` pair (two transactions; its floor is two commits),

and writes per second, sequential and from 8 concurrent writers (8 workflows, one store
instance, as one process runs it). The floor is measured on the same database in the
same run: SQLite, a bare ``sqlite3`` ``BEGIN IMMEDIATE; INSERT; COMMIT`` with the store's
pragmas (WAL, ``synchronous=FULL``); Postgres, a bare asyncpg ``INSERT`` in its own
(implicit) transaction. Concurrent floors use 8 connections.
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

from coder_chat.durable.postgres import PostgresStore, redact_dsn
from coder_chat.durable.records import Fence
from coder_chat.durable.sqlite import BUSY_TIMEOUT_MS, SqliteStore
from coder_chat.durable.store import DurableStore
from coder_chat.errors import CoderStoreError

WRITERS = 8
WARMUP = 20
#: About the size of a stored workflow record's JSON.
BODY = '{"tenant":"bench","workflow_id":"wf-0000","chat_id":"chat-0000"}' + " " * 250
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass
class Latency:
    p50: float
    p99: float
    per_second: float  # sequential: calls / elapsed


def summarize(samples: list[float], elapsed: float) -> Latency:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return Latency(statistics.median(ordered) * 1000, p99 * 1000, len(samples) / elapsed)


async def timed(call: Callable[[int], Awaitable[object]], n: int) -> Latency:
    for i in range(WARMUP):
        await call(-1 - i)
    samples: list[float] = []
    started = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - t0)
    return summarize(samples, time.perf_counter() - started)


# -- the stores -------------------------------------------------------------------------------


@dataclass
class StoreNumbers:
    checkpoint: Latency
    tool_pair: Latency
    concurrent_per_second: float


async def measure_store(store: DurableStore, n: int) -> StoreNumbers:
    fence = await store.begin_run("bench", "wf-seq")
    checkpoint = await timed(lambda i: store.save_checkpoint(fence, "chat-0000", i), n)

    async def pair(i: int) -> None:
        call = f"call-{i}"
        await store.claim_tool(fence, "chat-0000", call, tool_name="charge")
        await store.complete_tool(fence, "chat-0000", call, output={"receipt": i})

    tool_pair = await timed(pair, n)

    fences = [await store.begin_run("bench", f"wf-{w}") for w in range(WRITERS)]
    per_writer = max(1, n // WRITERS) * 2

    async def writer(f: Fence) -> None:
        for i in range(per_writer):
            await store.save_checkpoint(f, "chat-0000", i)

    started = time.perf_counter()
    await asyncio.gather(*(writer(f) for f in fences))
    concurrent = WRITERS * per_writer / (time.perf_counter() - started)
    return StoreNumbers(checkpoint, tool_pair, concurrent)


# -- the floors -------------------------------------------------------------------------------


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


def sqlite_floor(path: Path, n: int) -> tuple[Latency, float]:
    conn = sqlite_connect(path)
    conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id INTEGER PRIMARY KEY, body TEXT)")
    for _ in range(WARMUP):
        sqlite_commit(conn)
    samples: list[float] = []
    started = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        sqlite_commit(conn)
        samples.append(time.perf_counter() - t0)
    sequential = summarize(samples, time.perf_counter() - started)
    conn.close()

    per_writer = max(1, n // WRITERS) * 2
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
    concurrent = WRITERS * per_writer / (time.perf_counter() - started)
    return sequential, concurrent


async def postgres_floor(dsn: str, schema: str, n: int) -> tuple[Latency, float]:
    table = f'"{schema}".bench_floor'
    sql = f"INSERT INTO {table} (body) VALUES ($1)"
    pool = await asyncpg.create_pool(dsn, min_size=WRITERS, max_size=WRITERS)
    try:
        await pool.execute(f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, body JSONB)")
        async with pool.acquire() as conn:
            sequential = await timed(lambda _: conn.execute(sql, BODY), n)
        per_writer = max(1, n // WRITERS) * 2

        async def writer() -> None:
            async with pool.acquire() as own:
                for _ in range(per_writer):
                    await own.execute(sql, BODY)

        started = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(WRITERS)))
        concurrent = WRITERS * per_writer / (time.perf_counter() - started)
    finally:
        await pool.close()
    return sequential, concurrent


# -- report -----------------------------------------------------------------------------------


def report(name: str, ours: StoreNumbers, floor: Latency, floor_concurrent: float) -> None:
    print(f"\n{name}")
    print(f"  {'one durable write':<34} {'p50 ms':>8} {'p99 ms':>8} {'floor p50':>10} {'ratio':>6}")
    rows = [
        ("save_checkpoint (fenced)", ours.checkpoint, floor.p50, 1),
        ("claim_tool + complete_tool", ours.tool_pair, 2 * floor.p50, 2),
    ]
    for label, lat, floor_p50, commits in rows:
        floor_label = f"{floor_p50:.3f}" + ("x2" if commits == 2 else "")
        print(
            f"  {label:<34} {lat.p50:>8.3f} {lat.p99:>8.3f} {floor_label:>10} "
            f"{lat.p50 / floor_p50:>6.2f}"
        )
    print(f"  {'bare commit (the floor)':<34} {floor.p50:>8.3f} {floor.p99:>8.3f}")
    print(f"  {'writes per second':<34} {'store':>8} {'floor':>8} {'':>10} {'ratio':>6}")
    for label, mine, base in [
        ("sequential (save_checkpoint)", ours.checkpoint.per_second, floor.per_second),
        (f"{WRITERS} concurrent writers", ours.concurrent_per_second, floor_concurrent),
    ]:
        print(f"  {label:<34} {mine:>8,.0f} {base:>8,.0f} {'':>10} {mine / base:>6.2f}")


async def bench_sqlite(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="prefect-coder-bench-") as tmp:
        path = Path(tmp) / "store.db"
        store = SqliteStore(path)
        try:
            ours = await measure_store(store, n)
        finally:
            await store.close()
        floor, floor_concurrent = await asyncio.to_thread(sqlite_floor, path, n)
    report(
        f"sqlite (WAL, synchronous=FULL; a file under {tempfile.gettempdir()})",
        ours,
        floor,
        floor_concurrent,
    )


async def bench_postgres(dsn: str, n: int) -> None:
    schema = f"prefect_coder_bench_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(dsn, schema=schema, max_size=10)
    try:
        try:
            ours = await measure_store(store, n)
        except CoderStoreError as exc:
            print(f"\npostgres: skipped ({exc})")
            return
        finally:
            await store.close()
        floor, floor_concurrent = await postgres_floor(dsn, schema, n)
        version = await _server_version(dsn)
        report(f"postgres {version} at {redact_dsn(dsn)}", ours, floor, floor_concurrent)
    finally:
        await _drop(dsn, schema)


async def _server_version(dsn: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        return str(await conn.fetchval("SHOW server_version")).split()[0]
    finally:
        await conn.close()


async def _drop(dsn: str, schema: str) -> None:
    try:
        conn = await asyncpg.connect(dsn)
    except (OSError, asyncpg.PostgresError):
        return
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def run(n: int, dsn: str) -> None:
    print(f"store latency: {n} sequential calls per measurement after {WARMUP} warm-up;")
    print(f"{WRITERS} concurrent writers share one store instance (one process).")
    await bench_sqlite(n)
    await bench_postgres(dsn, n)


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
