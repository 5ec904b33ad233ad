"""Turn latency of ``ChatSession.generate`` beyond the simulator's own time, and memory per idle session.

Run: ``python -m bench.client_turns``. The simulator runs in this process, so
its own share of each turn is known exactly (``records.turns``: from the run's
start to its settle); the client's overhead is the rest of ``generate()``:
REST calls, the WebSocket dial, decoding and settling.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
import tracemalloc

from bench._cli import parser
from coder_chat import ChatClient, ChatSession
from coder_chat.simulator import SimulatorConfig, serve_simulator

TURNS = 200
SESSIONS = 1_000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000


async def turn_latency(turns: int) -> None:
    async with serve_simulator(SimulatorConfig()) as sim:
        session = ChatSession.connect(sim.base_url, sim.token, str(sim.organization_id))
        await session.generate("warm up")
        sim.records.turns.clear()
        walls = []
        for index in range(turns):
            started = time.perf_counter()
            await session.generate(f"turn {index}")
            walls.append(time.perf_counter() - started)
        await session.aclose()
        server = [t.duration for t in sim.records.turns]
    overhead = [w - s for w, s in zip(walls, server, strict=True)]
    print(f"turn latency over {turns} turns on one chat (ms):")
    print(f"  {'':>22} {'p50':>7} {'p99':>7}")
    for name, values in (
        ("generate()", walls),
        ("simulator's own time", server),
        ("client overhead", overhead),
    ):
        print(f"  {name:>22} {pct(values, 0.5):>7.2f} {pct(values, 0.99):>7.2f}")
    print(f"  mean overhead {statistics.mean(overhead) * 1000:.2f} ms")


def idle_sessions(shared: bool, count: int) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    client = ChatClient(base_url="http://127.0.0.1:1", token="t") if shared else None
    sessions = [
        ChatSession(
            client or ChatClient(base_url="http://127.0.0.1:1", token="t"),
            "org",
            chat_id=f"chat-{i}",
            last_seen_message_id=i + 1,
        )
        for i in range(count)
    ]
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del sessions
    return used / count


async def main(args: argparse.Namespace) -> None:
    await turn_latency(args.turns)
    own = idle_sessions(shared=False, count=args.sessions)
    shared = idle_sessions(shared=True, count=args.sessions)
    print(f"memory per idle session ({args.sessions:,} sessions, tracemalloc):")
    print(f"  with its own HTTP client   {own / 1024:8.1f} KiB")
    print(f"  sharing one ChatClient     {shared / 1024:8.1f} KiB")


if __name__ == "__main__":
    cli = parser(__doc__)
    cli.add_argument("--turns", type=int, default=TURNS, help="turns timed on one chat")
    cli.add_argument("--sessions", type=int, default=SESSIONS, help="idle sessions weighed")
    asyncio.run(main(cli.parse_args()))
