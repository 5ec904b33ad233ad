"""A TCP proxy in front of PostgreSQL that counts round trips, for tests and benchmarks.

Every byte passes through unchanged. A round trip is counted each time the client
starts speaking after the server last spoke (or for the first time): the client
waits for an answer before it speaks again, so the count is the number of times it
waited on the network, whatever the sizes of the packets or how TCP splits them.

:meth:`RoundTripProxy.cut` takes the server out of its clients' reach (their
connections dropped, new ones refused) while others still reach it directly, until
:meth:`RoundTripProxy.heal`.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from urllib.parse import urlsplit, urlunsplit


class RoundTripProxy:
    """``async with RoundTripProxy(upstream_dsn) as proxy``: connect to ``proxy.dsn``."""

    def __init__(self, upstream_dsn: str) -> None:
        self.upstream_dsn = upstream_dsn
        parts = urlsplit(upstream_dsn)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self.round_trips = 0
        self.is_cut = False
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    @property
    def dsn(self) -> str:
        """The upstream DSN pointed at the proxy, without TLS (the bytes stay readable)."""
        assert self._server is not None, "start the proxy first"
        port = self._server.sockets[0].getsockname()[1]
        parts = urlsplit(self.upstream_dsn)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
        query = "&".join(q for q in [parts.query, "sslmode=disable"] if q)
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))

    async def __aenter__(self) -> RoundTripProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()

    async def cut(self) -> None:
        """Drop every connection through the proxy and refuse new ones."""
        self.is_cut = True
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    def heal(self) -> None:
        self.is_cut = False

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.is_cut:
            client_w.close()
            return
        server_r, server_w = await asyncio.open_connection(*self._upstream)
        client_turn = [False]  # per connection: did the client speak since the server last did?

        async def from_client() -> None:
            while data := await client_r.read(65536):
                if not client_turn[0]:
                    client_turn[0] = True
                    self.round_trips += 1
                server_w.write(data)
                await server_w.drain()

        async def from_server() -> None:
            while data := await server_r.read(65536):
                client_turn[0] = False  # before the client can see it, so before it answers
                client_w.write(data)
                await client_w.drain()

        pipes = [asyncio.ensure_future(from_client()), asyncio.ensure_future(from_server())]
        self._pipes.update(pipes)
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
                self._pipes.discard(pipe)
            for writer in (client_w, server_w):
                with suppress(OSError):
                    writer.close()
