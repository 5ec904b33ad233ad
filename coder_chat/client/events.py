"""Transport events: what the client did on the wire, for logs and metrics.

Pass ``on_transport_event=callback`` to :class:`~coder_chat.ChatClient` (or to
:meth:`~coder_chat.ChatSession.connect`). The callback is called synchronously; whatever
it raises is swallowed, so observability can never disturb a turn. No event
carries the session token.

``segment:settle`` fires exactly once per ``segment:start``, with one of three
endings: a clean settle (``status`` and ``finish_reason``), a failure (``error``,
plus ``status`` when the server still settled), or a teardown (neither).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger("coder_chat.transport")

_readers = itertools.count(1)


def next_reader_id() -> int:
    """A process-wide monotonic id for each stream reader."""
    return next(_readers)


@dataclass(frozen=True)
class _HttpCall:
    """What every HTTP event names: the operation and its request line."""

    op: str
    method: str
    path: str


@dataclass(frozen=True)
class HttpRequest(_HttpCall):
    type: Literal["http:request"] = "http:request"


@dataclass(frozen=True)
class HttpResponse(_HttpCall):
    status: int
    duration: float
    type: Literal["http:response"] = "http:response"


@dataclass(frozen=True)
class HttpError(_HttpCall):
    error: str
    duration: float
    type: Literal["http:error"] = "http:error"


@dataclass(frozen=True)
class _StreamReader:
    """What every stream event names: the chat and the reader (one per dialled socket)."""

    chat_id: str
    reader: int


@dataclass(frozen=True)
class WsDial(_StreamReader):
    attempt: int
    after_id: int | None
    type: Literal["ws:dial"] = "ws:dial"


@dataclass(frozen=True)
class WsOpen(_StreamReader):
    attempt: int
    type: Literal["ws:open"] = "ws:open"


@dataclass(frozen=True)
class WsEvent(_StreamReader):
    event_type: str
    forwarded: bool
    type: Literal["ws:event"] = "ws:event"


@dataclass(frozen=True)
class WsClose(_StreamReader):
    code: int | None
    reason: str
    type: Literal["ws:close"] = "ws:close"


@dataclass(frozen=True)
class WsError(_StreamReader):
    error: str
    type: Literal["ws:error"] = "ws:error"


@dataclass(frozen=True)
class WsRedial(_StreamReader):
    consecutive_failures: int
    max_consecutive_failures: int
    backoff: float
    type: Literal["ws:redial"] = "ws:redial"


@dataclass(frozen=True)
class _Segment:
    """What every segment event names: its number in the session, and its chat."""

    segment: int
    chat_id: str | None


@dataclass(frozen=True)
class SegmentStart(_Segment):
    type: Literal["segment:start"] = "segment:start"


@dataclass(frozen=True)
class SegmentSettle(_Segment):
    duration: float
    status: str | None = None
    finish_reason: str | None = None
    error_name: str | None = None
    error_message: str | None = None
    type: Literal["segment:settle"] = "segment:settle"

    @property
    def ending(self) -> Literal["clean", "failure", "teardown"]:
        if self.error_name is not None:
            return "failure"
        return "clean" if self.finish_reason is not None else "teardown"


TransportEvent = (
    HttpRequest
    | HttpResponse
    | HttpError
    | WsDial
    | WsOpen
    | WsEvent
    | WsClose
    | WsError
    | WsRedial
    | SegmentStart
    | SegmentSettle
)
TransportCallback = Callable[[TransportEvent], object]


class Emitter:
    """Calls the user's callback, swallowing whatever it raises."""

    def __init__(self, callback: TransportCallback | None) -> None:
        self._callback = callback

    @property
    def enabled(self) -> bool:
        return self._callback is not None

    def __call__(self, event: TransportEvent) -> None:
        if self._callback is None:
            return
        try:
            self._callback(event)
        except Exception:
            logger.debug("transport event callback raised; ignored", exc_info=True)
