"""The per-chat stream reader: one logical stream over as many sockets as it takes.

A background task dials ``/stream?after_id=<cursor>``, decodes frames, drops
replays (:class:`~coder_chat.protocol.dedupe.StreamLedger`) and queues events for
the consumer. When a socket drops it redials with backoff (1 s, 2 s, 4 s, 8 s by
default). The reader ends in exactly one of these ways:

* the consumer closes it (:meth:`ChatStream.aclose`);
* a 4xx upgrade rejection other than 408/425/429: :class:`CoderApiError`;
* an unparsable frame, or a drop after deltas that lack episode coordinates
  (an era-B server, whose replay could not be de-duplicated): :class:`CoderStreamError`;
* ``max_failures`` consecutive failures without forward progress:
  :class:`CoderStreamError`, keeping the last failure as ``__cause__``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
from collections.abc import Callable
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.proxy import get_proxy
from websockets.uri import parse_uri

from ..errors import CoderApiError, CoderError, CoderStreamError
from ..protocol.dedupe import StreamLedger
from ..protocol.frames import FrameError, parse_frame
from ..protocol.models import AnyEvent
from ..protocol.retry import backoff, is_retryable_status
from .events import Emitter, WsClose, WsDial, WsError, WsEvent, WsOpen, WsRedial, next_reader_id
from .rest import TOKEN_HEADER, ChatClient

MAX_FRAME_BYTES = 16 * 1024 * 1024


class _RedactingLogger(logging.LoggerAdapter[logging.Logger]):
    """websockets' client logger, minus the token it logs with the handshake headers at DEBUG."""

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if len(args) == 2 and str(args[0]).lower() == TOKEN_HEADER.lower():
            args = (args[0], "<redacted>")
        super().log(level, msg, *args, **kwargs)


_WS_LOGGER = _RedactingLogger(logging.getLogger("websockets.client"), {})


@functools.lru_cache(maxsize=64)
def _proxy_for(scheme: str, netloc: str) -> str | None:
    """The proxy for streams to this server, from the environment, looked up once.

    websockets looks it up on every connection, reading the whole environment each
    time (a large share of a turn's CPU); the environment's proxy settings are read
    once per process here, as httpx reads them once per client.
    """
    return get_proxy(parse_uri(f"{scheme}://{netloc}/"))


def _stream_proxy(url: str) -> str | None:
    scheme, _, rest = url.partition("://")
    return _proxy_for(scheme, rest.split("/", 1)[0])


class _Failed(Exception):
    """A socket failed in a way that counts against the redial budget."""


class ChatStream:
    """Events of one chat, de-duplicated across redials. Call :meth:`start` first."""

    def __init__(
        self,
        client: ChatClient,
        chat_id: str,
        after_id: int | None,
        *,
        redial_initial: float = 1.0,
        redial_cap: float = 30.0,
        max_failures: int = 5,
        open_timeout: float = 10.0,
        emit: Emitter | None = None,
    ) -> None:
        self.client = client
        self.chat_id = chat_id
        self.ledger = StreamLedger(after_id)
        self.reader = next_reader_id()
        self._redial = (redial_initial, redial_cap)
        self._max_failures = max_failures
        self._open_timeout = open_timeout
        self._emit = emit or client.emit
        # Whole frames are queued (one hand-off per frame, not per event) and
        # drained through ``_ready``; a terminal error is queued as an exception.
        self._queue: asyncio.Queue[list[AnyEvent] | BaseException] = asyncio.Queue()
        self._ready: collections.deque[AnyEvent] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._attempt = 0

    @property
    def cursor(self) -> int:
        return self.ledger.cursor

    async def start(self) -> None:
        prefix = await self.client.resolve_prefix()
        url = self.client.ws_url(f"{prefix}/{self.chat_id}/stream")
        self._task = asyncio.create_task(self._run(url), name=f"coder-stream-{self.chat_id}")

    async def next(self) -> AnyEvent:
        """The next forwarded event; raises the reader's terminal error."""
        while not self._ready:
            self._take(await self._queue.get())
        return self._ready.popleft()

    async def next_batch(self) -> list[AnyEvent]:
        """Every event already decoded (at least one): a frame's worth without an await each."""
        while not self._ready:
            self._take(await self._queue.get())
        batch = list(self._ready)
        self._ready.clear()
        return batch

    def next_nowait(self) -> AnyEvent | None:
        """The next event if one is already here, else ``None``."""
        while not self._ready:
            try:
                batch = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                return None
            self._take(batch)
        return self._ready.popleft()

    def _take(self, item: list[AnyEvent] | BaseException) -> None:
        if isinstance(item, BaseException):
            self._queue.put_nowait(item)  # every later call fails the same way
            raise item
        self._ready.extend(item)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self, base_url: str) -> None:
        try:
            await self._dial_until_done(base_url)
        except CoderError as exc:
            self._queue.put_nowait(exc)
        except Exception as exc:  # noqa: BLE001 - a reader that dies silently hangs its consumer
            failure = CoderStreamError(
                f"the stream reader of chat {self.chat_id} failed: {type(exc).__name__}",
                chat_id=self.chat_id,
                retryable=False,
            )
            failure.__cause__ = exc
            self._queue.put_nowait(failure)

    async def _dial_until_done(self, base_url: str) -> None:
        failures, delays = 0, self._new_backoff()
        while True:
            progressed = await self._one_socket(base_url)
            if progressed:
                failures, delays = 0, self._new_backoff()
            if self.ledger.uncoordinated:
                raise CoderStreamError(
                    f"stream of chat {self.chat_id} dropped after deltas without episode "
                    "coordinates; a replay could not be de-duplicated",
                    chat_id=self.chat_id,
                    retryable=False,
                )
            failures += 1
            if failures >= self._max_failures:
                raise CoderStreamError(
                    f"stream of chat {self.chat_id} could not be re-established "
                    f"after {failures} consecutive failures",
                    chat_id=self.chat_id,
                    retryable=False,
                ) from self._last_failure
            delay = next(delays)
            self._emit(WsRedial(self.chat_id, self.reader, failures, self._max_failures, delay))
            await asyncio.sleep(delay)

    def _new_backoff(self) -> Any:
        return backoff(self._redial[0], 2.0, self._redial[1])

    _last_failure: BaseException | None = None

    async def _one_socket(self, base_url: str) -> bool:
        """Read one socket until it ends; return whether it made forward progress."""
        self._attempt += 1
        after = self.ledger.cursor or None
        url = f"{base_url}?after_id={after}" if after else base_url
        self._emit(WsDial(self.chat_id, self.reader, self._attempt, after))
        progressed = False

        def on_progress() -> None:
            nonlocal progressed
            progressed = True

        try:
            await self._read_socket(url, on_progress)
        except InvalidStatus as exc:
            self._rejected(exc)
        except FrameError as exc:
            raise CoderStreamError(
                f"unparsable frame on the stream of chat {self.chat_id}: {exc}",
                chat_id=self.chat_id,
                retryable=False,
            ) from None
        except _Failed as exc:
            self._last_failure = exc.__cause__ or exc
        return progressed

    async def _read_socket(self, url: str, on_progress: Callable[[], None]) -> None:
        try:
            async with connect(
                url,
                additional_headers=self.client.auth_headers,
                max_size=MAX_FRAME_BYTES,
                # coderd accepts chat streams with compression disabled: offering
                # permessage-deflate would only add a header it always declines.
                compression=None,
                open_timeout=self._open_timeout,
                proxy=_stream_proxy(url),
                user_agent_header="coder-chat-python",
                logger=_WS_LOGGER,
            ) as ws:
                self._emit(WsOpen(self.chat_id, self.reader, self._attempt))
                async for raw in ws:
                    self._deliver(parse_frame(raw), on_progress)
                self._emit(WsClose(self.chat_id, self.reader, ws.close_code, ws.close_reason or ""))
                raise _Failed("the server closed the stream")
        except InvalidStatus:
            raise
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd else None
            self._emit(
                WsClose(self.chat_id, self.reader, code, exc.rcvd.reason if exc.rcvd else "")
            )
            raise _Failed(f"connection closed ({code})") from exc
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            self._emit(WsError(self.chat_id, self.reader, f"{type(exc).__name__}: {exc}"))
            raise _Failed(str(exc)) from exc

    def _deliver(self, events: list[AnyEvent], on_progress: Callable[[], None]) -> None:
        forwarded: list[AnyEvent] = []
        progressed, accept, observed = False, self.ledger.accept, self._emit.enabled
        for event in events:
            verdict = accept(event)
            if observed:
                self._emit(WsEvent(self.chat_id, self.reader, event.type, verdict.forward))
            if verdict.forward:
                forwarded.append(event)
                progressed = progressed or verdict.progress
        if progressed:
            on_progress()
        if forwarded:
            self._queue.put_nowait(forwarded)

    def _rejected(self, exc: InvalidStatus) -> None:
        status = exc.response.status_code
        message = _rejection_message(exc)
        self._emit(WsError(self.chat_id, self.reader, f"upgrade rejected ({status})"))
        if not is_retryable_status(status):  # a 4xx other than 408/425/429 is terminal
            raise CoderApiError(status, "GET", f"/{self.chat_id}/stream", message) from None
        self._last_failure = CoderApiError(status, "GET", f"/{self.chat_id}/stream", message)


def _rejection_message(exc: InvalidStatus) -> str:
    try:
        body = json.loads(exc.response.body or b"{}")
    except ValueError:
        body = {}
    return (
        str(body.get("message") or "WebSocket upgrade rejected")
        if isinstance(body, dict)
        else "rejected"
    )
