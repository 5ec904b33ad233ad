"""What the browser tests share: where things are, how long they may take, a clock, and the
route that keeps the browser on loopback."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from playwright.async_api import Route

from .stack import BIN, POOL, ROOT

__all__ = ["BIN", "POOL", "ROOT", "STARTUP_TIMEOUT", "UI_TIMEOUT_MS", "Clock", "loopback_only"]

#: Bounds for cold processes on a loaded machine; nothing here is timed.
STARTUP_TIMEOUT = 120.0
UI_TIMEOUT_MS = 60_000


@dataclass
class Clock:
    """Seconds since the start at each phase, printed with a failure (nothing is timed)."""

    start: float = field(default_factory=time.monotonic)

    def mark(self, what: str) -> None:
        print(f"{time.monotonic() - self.start:7.1f}s  {what}")


async def loopback_only(route: Route) -> None:
    """Let the UI reach its own server; abort anything else (a logo on the internet)."""
    if route.request.url.startswith(("http://127.0.0.1:", "data:", "blob:")):
        await route.continue_()
    else:
        await route.abort()
