"""Every error ``coder_chat`` raises, under one root.

::

    CoderError                      anything this library raises on purpose
    ├── CoderConfigError            bad arguments; raised at once, never retried (also ValueError)
    ├── CoderApiError               a non-2xx answer: status, method, path, message, detail
    │   └── CoderUsageLimitError    409, the user's usage limit reached: spent, limit, resets_at
    ├── CoderTransportError         the request or socket failed below HTTP (connect, reset, timeout)
    ├── CoderChatError              a turn ended badly: kind, retryable, chat_id, provider, status_code
    ├── CoderStreamError            the chat stream could not be re-established: chat_id, retryable
    ├── CoderToolError              a durable tool's effect ended with no known outcome (retryable)
    └── CoderStoreError             a durable store failed (unreachable, corrupt, newer schema)

Foreign exceptions (httpx, websockets, asyncpg, sqlite3) are translated where they
happen and never leak; the original is kept as ``__cause__``. Whether a failure
is worth retrying is decided in one place, :func:`coder_chat.protocol.retry.is_retryable`.

No message, ``repr`` or attribute of these errors ever carries the session token:
the token travels only in a request header.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from datetime import datetime


class CoderError(Exception):
    """Root of every error this library raises."""

    def __reduce__(self) -> tuple[object, ...]:
        # Prefect persists a failed task's exception: keep its type and every attribute.
        # The subclasses' constructors differ (keyword-only arguments), so none is called.
        return (_rebuild, (type(self), self.args, self.__dict__.copy()))


def _rebuild(
    kind: type[CoderError], args: tuple[object, ...], state: dict[str, object]
) -> CoderError:
    error = kind.__new__(kind)
    error.args = args
    error.__dict__.update(state)
    return error


class CoderConfigError(CoderError, ValueError):
    """Arguments that can never work (a cursor without a chat id, a bad tool)."""


@dataclass(eq=False)
class CoderApiError(CoderError):
    """The server answered with a non-2xx status."""

    status: int
    method: str
    path: str
    message: str
    detail: str | None = None

    def __post_init__(self) -> None:
        text = f"Coder API {self.method} {self.path} failed ({self.status}): {self.message}"
        super().__init__(f"{text} — {self.detail}" if self.detail else text)


@dataclass(eq=False)
class CoderUsageLimitError(CoderApiError):
    """Coder refused new work: the user's usage limit is reached (409 "Chat usage limit
    exceeded."), with what was spent, the limit (micros) and when it resets. Never
    retried: the same request is refused until then."""

    spent_micros: int | None = None
    limit_micros: int | None = None
    resets_at: datetime | None = None


class CoderTransportError(CoderError):
    """The network failed before an HTTP answer arrived (or the socket broke).

    ``sent`` is false when the request never left (no connection could be made), so
    the server cannot have acted on it; true when it may have.
    """

    def __init__(self, operation: str, reason: str, *, sent: bool = True) -> None:
        self.operation = operation
        self.reason = reason
        self.sent = sent
        super().__init__(f"{operation} failed: {reason}")


@dataclass(eq=False)
class CoderChatError(CoderError):
    """A turn ended badly: the server reported ``error``, or the turn timed out.

    ``kind`` is the server's error kind (``rate_limit``, ``overloaded``…) or one of
    ours: ``timeout`` (the segment's ``request_timeout`` expired) and
    ``stream_closed``. ``retryable`` says the *failure* is transient, not that a
    re-run is free: a re-run resubmits the prompt as a new user turn.
    """

    message: str
    _: KW_ONLY
    kind: str
    retryable: bool
    chat_id: str | None = None
    provider: str | None = None
    status_code: int | None = None
    detail: str | None = None

    def __post_init__(self) -> None:
        super().__init__(f"{self.message}: {self.detail}" if self.detail else self.message)


class CoderStreamError(CoderError):
    """The chat's stream could not be re-established within its redial budget.

    ``chat_id`` names the chat even when the session discarded it, so it can be
    retired or swept. ``retryable`` is true only for a turn that created its chat
    and touched nothing outside it (no workspace, no MCP servers, no uploads): a
    retry then starts clean on a fresh chat.
    """

    def __init__(self, message: str, *, chat_id: str | None, retryable: bool) -> None:
        self.chat_id = chat_id
        self.retryable = retryable
        super().__init__(message)


class CoderToolError(CoderError):
    """A durable tool's function raised without saying the effect failed: whether it
    happened is unknown. The turn stops there (its pause stays on the server, the
    ledger entry ``committing``) and recovery runs the call again under the same
    idempotency key, so the effect happens once. Tools say a definitive failure the
    model should see by raising :class:`~coder_chat.client.tools.ToolFailed`."""

    def __init__(self, tool_name: str, tool_call_id: str, reason: str) -> None:
        self.tool_name = tool_name
        self.tool_call_id = tool_call_id
        self.reason = reason
        self.retryable = True
        super().__init__(
            f"tool {tool_name} (call {tool_call_id}) ended with no known outcome ({reason}); "
            "it is run again under the same idempotency key"
        )


class CoderStoreError(CoderError):
    """A durable store failed; ``retryable`` when trying again may succeed."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        self.retryable = retryable
        super().__init__(message)
