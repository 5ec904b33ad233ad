"""A client keeps at most ``max_in_flight`` requests on the wire and reuses their connections.

The server here is a plain keep-alive HTTP/1.1 server over a real socket that holds each
request a moment and counts what reaches it: requests at once, and connections dialled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from coder_chat import ChatClient
from coder_chat.client.rest import MAX_IN_FLIGHT

HOLD_SECONDS = 0.02
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]"


@dataclass
class Counts:
    at_once: int = 0
    most_at_once: int = 0
    connections: int = 0
    requests: int = 0


@contextlib.asynccontextmanager
async def counting_server() -> AsyncIterator[tuple[str, Counts]]:
    counts = Counts()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counts.connections += 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):  # GETs only: no body to read
                counts.requests += 1
                counts.at_once += 1
                counts.most_at_once = max(counts.most_at_once, counts.at_once)
                await asyncio.sleep(HOLD_SECONDS)
                counts.at_once -= 1
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", counts
    finally:
        server.close()
        await server.wait_closed()


async def many_reads(client: ChatClient, how_many: int) -> None:
    await client.list_chats()  # settles the route prefix first, as a fleet's first call does
    await asyncio.gather(*(client.list_chats() for _ in range(how_many)))


async def test_a_fleet_of_requests_waits_its_turn_on_a_few_reused_connections() -> None:
    async with counting_server() as (url, counts), ChatClient(base_url=url, token="t") as client:
        await many_reads(client, 3 * MAX_IN_FLIGHT)
    assert counts.requests == 3 * MAX_IN_FLIGHT + 1
    assert counts.most_at_once <= MAX_IN_FLIGHT
    # httpcore keeps at most 20 idle connections and closes any idle one beyond that, so
    # more requests at once than that would dial again and again.
    assert counts.connections <= MAX_IN_FLIGHT


async def test_max_in_flight_sets_how_many_requests_are_on_the_wire_at_once() -> None:
    async with (
        counting_server() as (url, counts),
        ChatClient(base_url=url, token="t", max_in_flight=3) as client,
    ):
        await many_reads(client, 30)
    assert counts.requests == 31
    assert counts.most_at_once <= 3
    assert counts.connections <= 3
