"""The one place that decides whether a failure is worth retrying, and how long to wait.

Prefect's retry condition, the stream's redial loop and the stores all ask
:func:`is_retryable`. A ``True`` means the failure is transient; whether a retry
is *safe* (a resubmitted prompt runs the turn again) is the durable layer's call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from ..errors import (
    CoderApiError,
    CoderChatError,
    CoderConfigError,
    CoderStoreError,
    CoderStreamError,
    CoderToolError,
    CoderTransportError,
)

#: HTTP statuses that say "try again later".
RETRYABLE_STATUSES = frozenset({408, 425, 429})


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES or status >= 500


def is_retryable(exc: BaseException) -> bool:
    """True when the same call may succeed later; never for cancellation or misuse."""
    if isinstance(exc, asyncio.CancelledError | CoderConfigError):
        return False
    if isinstance(exc, CoderApiError):
        return is_retryable_status(exc.status)
    if isinstance(exc, CoderTransportError):
        return True
    if isinstance(exc, CoderChatError | CoderStreamError | CoderStoreError | CoderToolError):
        return exc.retryable
    return False


def backoff(initial: float = 1.0, factor: float = 2.0, cap: float = 30.0) -> Iterator[float]:
    """Delays ``initial``, ``initial*factor``, … capped at ``cap`` (1 s, 2 s, 4 s, 8 s…)."""
    delay = initial
    while True:
        yield min(delay, cap)
        delay *= factor
