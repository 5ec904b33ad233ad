"""How fast the simulator streams, and how many concurrent chats it carries.

Run: ``python bench/simulator_throughput.py``. Prints:

1. stream events per second to one client, for one turn of 100,000 deltas, read
   with a bare ``websockets`` + ``json.loads`` loop;
2. for rising numbers of concurrent chats, each with its own stream socket and a
   turn of 20 deltas: wall time, turns per second, and per-turn latency.

The simulator runs in its own process; nothing is timed inside a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import httpx
import websockets

from bench._cli import int_list, parser
from bench._simproc import SimProcess, simulator_process

DELTAS = 100_000
LEVELS = (10, 50, 100, 200, 400)


async def create(http: httpx.AsyncClient, sim: SimProcess, text: str) -> str:
    body = {"organization_id": sim.organization_id, "content": [{"type": "text", "text": text}]}
    response = await http.post("/api/v2/chats", json=body)
    response.raise_for_status()
    chat_id: str = response.json()["id"]
    return chat_id


async def read_turn(sim: SimProcess, chat_id: str) -> int:
    """Read the chat's stream until ``waiting``; return how many events arrived."""
    url = sim.base_url.replace("http://", "ws://") + f"/api/v2/chats/{chat_id}/stream"
    count = 0
    async with websockets.connect(url, additional_headers=sim.headers, max_size=None) as ws:
        async for raw in ws:
            frame: list[dict[str, Any]] = json.loads(raw)
            count += len(frame)
            if any(e["type"] == "status" and e["status"]["status"] == "waiting" for e in frame):
                return count
    raise RuntimeError("stream closed before the turn settled")


async def single_stream(sim: SimProcess, deltas: int) -> None:
    async with httpx.AsyncClient(base_url=sim.base_url, headers=sim.headers) as http:
        chat_id = await create(http, sim, f"bench /sleep 0.3 /deltas {deltas}")
        started = time.perf_counter()
        events = await read_turn(sim, chat_id)
        elapsed = time.perf_counter() - started - 0.3
    print(f"single stream: {events} events in {elapsed:.2f}s = {events / elapsed:,.0f} events/s")


async def one_turn(http: httpx.AsyncClient, sim: SimProcess, index: int) -> float:
    started = time.perf_counter()
    chat_id = await create(http, sim, f"chat {index} /sleep 0.05 /deltas 20")
    await read_turn(sim, chat_id)
    return time.perf_counter() - started


async def concurrent_chats(sim: SimProcess, levels: tuple[int, ...]) -> None:
    print("concurrent chats (turn of 20 deltas each, own stream socket each):")
    print(f"  {'chats':>6} {'wall s':>8} {'turns/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    limits = httpx.Limits(max_connections=500, max_keepalive_connections=500)
    async with httpx.AsyncClient(
        base_url=sim.base_url, headers=sim.headers, limits=limits, timeout=60
    ) as http:
        for level in levels:
            started = time.perf_counter()
            latencies = sorted(
                await asyncio.gather(*(one_turn(http, sim, i) for i in range(level)))
            )
            wall = time.perf_counter() - started
            p50 = statistics.median(latencies) * 1000
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
            print(f"  {level:>6} {wall:>8.2f} {level / wall:>9.1f} {p50:>8.0f} {p99:>8.0f}")


async def main(args: argparse.Namespace) -> None:
    with simulator_process() as sim:
        await single_stream(sim, args.deltas)
        await concurrent_chats(sim, args.chats)


def parse() -> argparse.Namespace:
    cli = parser(__doc__)
    cli.add_argument("--deltas", type=int, default=DELTAS, help="deltas of the single stream")
    cli.add_argument(
        "--chats", type=int_list, default=LEVELS, help="numbers of chats at once (10,50,...)"
    )
    return cli.parse_args()


if __name__ == "__main__":
    options = parse()
    sys.path.insert(0, ".")
    asyncio.run(main(options))
