"""The Coder host's front door: ``python -m tests.fleet.relay LISTEN UPSTREAM LOG IMPAIR``.

A byte-for-byte TCP relay in front of the simulator, on the Coder host's address
(the simulator itself listens on the host's loopback, so nothing reaches it but
through here). It changes nothing on the wire; it only watches the client's side
of each connection, parses HTTP/1.1 request heads as they pass (bodies by
``Content-Length`` or chunked; a WebSocket upgrade turns the rest of the
connection into opaque frames) and writes one JSON line per request to LOG::

    {"at": 1718000000.123, "src": "10.231.0.41:53122", "method": "POST",
     "path": "/api/v2/chats/…/messages", "ws": false}

``src`` is what the simulator's own request records lack: which host, and which
socket of it, sent the request (:mod:`.witness` maps a socket to its flow run).

IMPAIR is a JSON file the lab rewrites at will: ``{"10.231.0.41": 0.15}`` delays
every byte between that address and the simulator by 0.15 s each way (in order,
without holding up the reading), the fixed part of a slow link.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

CHUNK = 65536


@dataclass
class RequestHeads:
    """Finds request heads in a client's byte stream, however it is split."""

    buffer: bytearray = field(default_factory=bytearray)
    #: Body bytes still to skip; -1 while inside a chunked body.
    body_left: int = 0
    opaque: bool = False

    def feed(self, data: bytes) -> list[tuple[str, str, bool]]:
        """(method, path, websocket) of every request head completed by ``data``."""
        if self.opaque:
            return []
        self.buffer += data
        heads = []
        while (head := self._next()) is not None:
            heads.append(head)
            if head[2]:
                self.opaque = True
                break
        return heads

    def _next(self) -> tuple[str, str, bool] | None:
        if not self._skip_body():
            return None
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        del self.buffer[: end + 4]
        method, path = [*lines[0].split(" "), "", ""][:2]
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])
        }
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.body_left = -1 if chunked else int(headers.get("content-length", "0") or 0)
        upgrade = headers.get("upgrade", "").lower() == "websocket"
        return method, path, upgrade

    def _skip_body(self) -> bool:
        """Consume the current body; whether it is all there."""
        if self.body_left > 0:
            taken = min(self.body_left, len(self.buffer))
            del self.buffer[:taken]
            self.body_left -= taken
            return self.body_left == 0
        while self.body_left == -1:
            line_end = self.buffer.find(b"\r\n")
            if line_end < 0:
                return False
            size = int(bytes(self.buffer[:line_end]).split(b";")[0] or b"0", 16)
            if size == 0:
                trailer_end = self.buffer.find(b"\r\n\r\n", line_end)
                if trailer_end < 0:
                    return False
                del self.buffer[: trailer_end + 4]
                self.body_left = 0
                return True
            if len(self.buffer) < line_end + 2 + size + 2:
                return False
            del self.buffer[: line_end + 2 + size + 2]
        return True


@dataclass
class Impairments:
    """Per-address delays, re-read from their file when it changes."""

    path: Path
    delays: dict[str, float] = field(default_factory=dict)
    _stamp: float = -1.0
    _checked: float = 0.0

    def delay(self, address: str) -> float:
        now = time.monotonic()
        if now - self._checked > 0.1:
            self._checked = now
            with contextlib.suppress(OSError, ValueError):
                stamp = self.path.stat().st_mtime
                if stamp != self._stamp:
                    self._stamp = stamp
                    self.delays = {
                        k: float(v) for k, v in json.loads(self.path.read_text()).items()
                    }
        return self.delays.get(address, 0.0)


@dataclass
class Side:
    """One direction of a connection: where it reads and writes, whose address it serves."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    #: The client's address and port.
    src: str
    #: Set on the client-to-server side only.
    watch: RequestHeads | None = None


async def pump(side: Side, impair: Impairments, log: TextIO) -> None:
    """Copy one direction until EOF, each chunk as late as the client's address says."""
    reader, writer, watch, src = side.reader, side.writer, side.watch, side.src
    address = src.rsplit(":", 1)[0]
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
    sender = asyncio.create_task(_send_on_time(queue, writer))
    try:
        while data := await reader.read(CHUNK):
            if watch is not None:
                for method, path, ws in watch.feed(data):
                    entry = {
                        "at": time.time(),
                        "src": src,
                        "method": method,
                        "path": path,
                        "ws": ws,
                    }
                    log.write(json.dumps(entry) + "\n")
                    log.flush()
            queue.put_nowait((time.monotonic() + impair.delay(address), data))
    except (ConnectionError, OSError):
        pass
    finally:
        queue.put_nowait((0.0, b""))
        with contextlib.suppress(ConnectionError, OSError):
            await sender


async def _send_on_time(
    queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
) -> None:
    try:
        while True:
            due, data = await queue.get()
            if not data:
                return
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def serve(listen: str, upstream: str, log: TextIO, impair: Impairments) -> None:
    up_host, up_port = upstream.rsplit(":", 1)

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        peer = client_w.get_extra_info("peername")
        src = f"{peer[0]}:{peer[1]}"
        try:
            server_r, server_w = await asyncio.open_connection(up_host, int(up_port))
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            pump(Side(client_r, server_w, src, RequestHeads()), impair, log),
            pump(Side(server_r, client_w, src), impair, log),
        )

    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(handle, host, int(port), reuse_address=True)
    print(f"relay listening on {listen} for {upstream}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    listen, upstream, log_path, impair_path = argv[1:5]
    with open(log_path, "a", encoding="utf-8") as log:
        asyncio.run(serve(listen, upstream, log, Impairments(Path(impair_path))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
