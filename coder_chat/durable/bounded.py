"""``within``: a time bound on one recovery action whose running out can be retried.

A bare ``TimeoutError`` out of a Prefect task makes it ``TimedOut``, which is never
retried, so one slow read of a loaded server would end the whole workflow. Running
out of a recovery bound is transient: it becomes a retryable ``CoderChatError``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from ..errors import CoderChatError


@contextlib.asynccontextmanager
async def within(seconds: float, doing: str, chat_id: str) -> AsyncIterator[None]:
    """Bound the block to ``seconds``; when they run out, raise a retryable timeout."""
    try:
        async with asyncio.timeout(seconds) as clock:
            yield
    except TimeoutError:
        if not clock.expired():
            raise  # someone else's timeout, passing through
        raise CoderChatError(
            f"{doing} on chat {chat_id} took longer than {seconds:.0f} s",
            kind="timeout",
            retryable=True,
            chat_id=chat_id,
        ) from None
