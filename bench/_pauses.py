"""Where a row's wall time went without its work moving: full garbage collections, and the
longest the event loop went without running its callbacks (anything that blocked it)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

#: How often the watcher asks to wake; a stall is how late it woke.
TICK_SECONDS = 0.01


@dataclass
class Pauses:
    #: Full (generation 2) collections in the row, and the seconds they took.
    full_collections: int = 0
    full_collection_seconds: float = 0.0
    #: The event loop's longest stall, and the seconds of all stalls over 0.1 s.
    longest_stall: float = 0.0
    long_stalls_seconds: float = 0.0
    _started: float | None = field(default=None, repr=False)

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.full_collections += 1
            self.full_collection_seconds += time.perf_counter() - self._started
            self._started = None

    def on_stall(self, late: float) -> None:
        self.longest_stall = max(self.longest_stall, late)
        if late > 0.1:
            self.long_stalls_seconds += late


@contextlib.contextmanager
def full_collections(pauses: Pauses) -> Iterator[Pauses]:
    gc.callbacks.append(pauses.on_gc)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(pauses.on_gc)


@contextlib.asynccontextmanager
async def loop_stalls(pauses: Pauses) -> AsyncIterator[Pauses]:
    """Watch this event loop while the block runs."""

    async def watch() -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(TICK_SECONDS)
            pauses.on_stall(max(0.0, time.perf_counter() - asked - TICK_SECONDS))

    watcher = asyncio.create_task(watch())
    try:
        yield pauses
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
