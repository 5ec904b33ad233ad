"""Events per second the client decodes, beside a bare websockets + json.loads loop.

Run: ``python -m bench.client_decode``. A replay server (another process) sends
100,000 deltas at one event a frame and at 64 a frame. The client side parses
each frame into typed events and de-duplicates them (``ChatStream``); the
baseline only calls ``json.loads``. Both read the same stream in the same run,
uncompressed, as Coder serves it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

import websockets

from bench._cli import parser
from bench._replay_server import DELTAS
from coder_chat import ChatClient, ChatStream
from coder_chat.protocol.models import StatusEvent

ROUNDS = 3


async def bare_loop(base: str, per_frame: int) -> float:
    url = f"{base.replace('http://', 'ws://')}/api/v2/chats/frames-{per_frame}/stream"
    started, count = time.perf_counter(), 0
    # Offer no compression, like ChatStream, so both loops do the same handshake.
    async with websockets.connect(url, max_size=None, compression=None) as ws:
        async for raw in ws:
            frame = json.loads(raw)
            count += len(frame)
            if frame[-1]["type"] == "status":
                break
    return count / (time.perf_counter() - started)


async def client_loop(base: str, per_frame: int) -> float:
    async with ChatClient(base_url=base, token="bench") as client:
        await client.resolve_prefix()
        stream = ChatStream(client, f"frames-{per_frame}", None)
        started, count = time.perf_counter(), 0
        await stream.start()
        try:
            while True:
                batch = await stream.next_batch()
                count += len(batch)
                if isinstance(batch[-1], StatusEvent):
                    break
        finally:
            await stream.aclose()
    return count / (time.perf_counter() - started)


async def measure(base: str, deltas: int, rounds: int) -> None:
    print(f"decode rate over {deltas:,} deltas (best of {rounds}):")
    print(f"  {'events/frame':>12} {'bare ev/s':>12} {'client ev/s':>12} {'ratio':>6}")
    for per_frame in (1, 64):
        bare = max([await bare_loop(base, per_frame) for _ in range(rounds)])
        ours = max([await client_loop(base, per_frame) for _ in range(rounds)])
        print(f"  {per_frame:>12} {bare:>12,.0f} {ours:>12,.0f} {ours / bare:>6.2f}")


def main(args: argparse.Namespace) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "bench._replay_server", str(args.deltas)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        asyncio.run(measure(f"http://127.0.0.1:{port}", args.deltas, args.rounds))
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    cli = parser(__doc__)
    cli.add_argument("--deltas", type=int, default=DELTAS, help="deltas in each stream")
    cli.add_argument("--rounds", type=int, default=ROUNDS, help="streams read per loop (best of)")
    main(cli.parse_args())
