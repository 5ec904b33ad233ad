"""A minimal stand-in for the stream endpoint that replays pre-encoded frames.

``/api/v2/chats/<chat>/stream`` where ``<chat>`` is ``frames-<N>`` sends 100,000
``message_part`` deltas (or as many as its first argument says) in frames of N events, then
``status: waiting``. Any other HTTP request gets ``[]`` (enough for the client's prefix probe).
Run as a module; it prints its port on the first line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from http import HTTPStatus

from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

DELTAS = 100_000
CHAT = "0b5e7c6a-0000-4000-8000-000000000000"


def frames(per_frame: int, deltas: int) -> list[str]:
    events = [
        {
            "type": "message_part",
            "chat_id": CHAT,
            "message_part": {
                "role": "assistant",
                "part": {"type": "text", "text": "x"},
                "history_version": 1,
                "generation_attempt": 0,
                "seq": seq,
            },
        }
        for seq in range(1, deltas + 1)
    ]
    events.append({"type": "status", "chat_id": CHAT, "status": {"status": "waiting"}})
    return [
        json.dumps(events[i : i + per_frame], separators=(",", ":"))
        for i in range(0, len(events), per_frame)
    ]


CACHE: dict[int, list[str]] = {}


def process_request(connection: ServerConnection, request: Request) -> Response | None:
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return None
    body = b"[]"
    headers = Headers([("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return Response(HTTPStatus.OK, "OK", headers, body)


async def handler(ws: ServerConnection) -> None:
    assert ws.request is not None
    per_frame = int(ws.request.path.split("/")[4].split("-")[1])
    for frame in CACHE[per_frame]:
        await ws.send(frame)
    await ws.wait_closed()


async def main(deltas: int) -> None:
    for size in (1, 64):
        CACHE[size] = frames(size, deltas)
    # No compression, as coderd serves chat streams: deflate would change the
    # measured decode cost, and no client of Coder ever pays it.
    async with serve(
        handler,
        "127.0.0.1",
        0,
        process_request=process_request,
        max_size=None,
        compression=None,
    ) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        print(port, flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else DELTAS)))
