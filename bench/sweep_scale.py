"""How the sweep scales: list and classify 10,000 labelled chats.

Run: ``python -m bench.sweep_scale``. The simulator (in this process) is seeded
with N labelled chats, some owned by checkpoints in a SQLite store; the sweep
runs in dry-run mode (list and classify everything, act on nothing) and the
simulator's own request log says how many requests it made. Requests should
grow with pages (N / page size), not with chats.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from bench._cli import int_list, parser
from coder_chat import ChatClient
from coder_chat.durable.markers import chat_labels
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.sweep import SweepPolicy, sweep
from coder_chat.simulator import SimulatorConfig, serve_simulator

SIZES = (1_000, 10_000)
PAGE_SIZES = (100, 200)


async def one(chats: int, page_size: int) -> None:
    async with serve_simulator(SimulatorConfig()) as sim:
        tenant = str(sim.organization_id)
        store = SqliteStore(Path(tempfile.mkdtemp()) / "ledger.db")
        labels = chat_labels("bench-wf", 1, "local", await store.store_id())
        ids = sim.seed(chats, labels=labels, age_seconds=3600)
        for index, chat_id in enumerate(ids[:50]):  # a few owned by checkpoints
            fence = await store.begin_run(tenant, f"owner-{index}")
            await store.save_checkpoint(fence, str(chat_id), None)
        sim.records.clear_requests()
        policy = SweepPolicy(dry_run=True, page_size=page_size)
        async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
            started = time.perf_counter()
            report = await sweep(client, store, tenant, policy, report=lambda _: None)
            elapsed = time.perf_counter() - started
        await store.close()
        requests = len(sim.records.requests)
        retire = sum(1 for f in report.findings if f.action == "would retire")
        print(
            f"  {chats:>7,} {page_size:>6} {elapsed:>8.2f} {requests:>9} "
            f"{chats / elapsed:>10,.0f} {retire:>8,}"
        )


async def main(sizes: tuple[int, ...]) -> None:
    print("sweep, dry run (list + classify every labelled chat):")
    print(
        f"  {'chats':>7} {'page':>6} {'time s':>8} {'requests':>9} {'chats/s':>10} {'orphans':>8}"
    )
    for chats in sizes:
        for page_size in PAGE_SIZES:
            await one(chats, page_size)


if __name__ == "__main__":
    cli = parser(__doc__)
    cli.add_argument(
        "--chats", type=int_list, default=SIZES, help="labelled chats seeded (1000,10000)"
    )
    asyncio.run(main(cli.parse_args().chats))
