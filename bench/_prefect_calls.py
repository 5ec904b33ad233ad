"""What this process asks of Prefect's API, counted by patching Prefect's own client classes
(nothing of ours is touched):

- **HTTP requests**: every attempt a Prefect HTTP client (``PrefectHttpxAsyncClient``, and
  the sync one) sends, retries included, by method and route (ids replaced by ``{id}``);
- **events**: each event handed to an events client (task-run state changes travel this
  way, on the events websocket, not as HTTP requests);
- **log records**: each record queued for the API (they leave in batches, as HTTP requests
  to ``/logs/``, counted above).

Background workers (logs, events) send from their own threads: :func:`drain` waits for
what they hold, so that a row is charged with what it caused.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class ApiCalls:
    """Counts since the process started (or, subtracted, over a window)."""

    routes: Counter[str] = field(default_factory=Counter)
    events: int = 0
    logs: int = 0

    @property
    def http(self) -> int:
        return sum(self.routes.values())

    def __sub__(self, other: ApiCalls) -> ApiCalls:
        routes = Counter(self.routes)
        routes.subtract(other.routes)
        return ApiCalls(+routes, self.events - other.events, self.logs - other.logs)

    def top_routes(self, per: float, n: int = 6) -> str:
        """``POST /logs/ 0.12, PATCH /flow_runs/{id} 0.01``: the ``n`` commonest, each / ``per``."""
        return ", ".join(
            f"{route} {count / per:.3f}" for route, count in self.routes.most_common(n)
        )


class _Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.routes: Counter[str] = Counter()
        self.events = 0
        self.logs = 0

    def request(self, method: str, path: str) -> None:
        route = f"{method} {_ID.sub('{id}', path)}"
        with self.lock:
            self.routes[route] += 1

    def event(self) -> None:
        with self.lock:
            self.events += 1

    def log(self) -> None:
        with self.lock:
            self.logs += 1

    def snapshot(self) -> ApiCalls:
        with self.lock:
            return ApiCalls(Counter(self.routes), self.events, self.logs)


COUNTS = _Counts()
_installed = False


def install() -> None:
    """Patch Prefect's HTTP clients, events client and API log worker to count (once)."""
    global _installed
    if _installed:
        return
    _installed = True
    from prefect.client.base import PrefectHttpxAsyncClient, PrefectHttpxSyncClient
    from prefect.events.clients import EventsClient
    from prefect.logging.handlers import APILogWorker

    def path_of(request: Any) -> str:
        # The API's own prefix (``/api``) is the same for every request: left out.
        path = str(request.url.path)
        return path[4:] if path.startswith("/api/") else path

    def counted_send(kwargs: dict[str, Any], args: tuple[Any, ...]) -> tuple[Any, ...]:
        """``_send_with_retry``'s arguments, its ``send`` wrapped to count each attempt."""
        if "send" in kwargs:  # how Prefect calls it
            kwargs["send"] = send_counter(kwargs["send"], kwargs["request"])
            return args
        request, send, *rest = args
        return (request, send_counter(send, request), *rest)

    def send_counter(send: Callable[..., Any], request: Any) -> Callable[..., Any]:
        def counting(*a: Any, **k: Any) -> Any:
            COUNTS.request(str(request.method), path_of(request))
            return send(*a, **k)

        return counting

    async_original = PrefectHttpxAsyncClient._send_with_retry
    sync_original = PrefectHttpxSyncClient._send_with_retry

    async def async_send_with_retry(self: Any, *args: Any, **kwargs: Any) -> Any:
        args = counted_send(kwargs, args)
        return await async_original(self, *args, **kwargs)

    def sync_send_with_retry(self: Any, *args: Any, **kwargs: Any) -> Any:
        args = counted_send(kwargs, args)
        return sync_original(self, *args, **kwargs)

    setattr(PrefectHttpxAsyncClient, "_send_with_retry", async_send_with_retry)  # noqa: B010
    setattr(PrefectHttpxSyncClient, "_send_with_retry", sync_send_with_retry)  # noqa: B010

    emit_original = EventsClient.emit

    async def emit(self: Any, event: Any) -> None:
        COUNTS.event()
        await emit_original(self, event)

    setattr(EventsClient, "emit", emit)  # noqa: B010

    log_original = APILogWorker.send

    def send_log(self: Any, item: Any) -> None:
        COUNTS.log()
        log_original(self, item)

    setattr(APILogWorker, "send", send_log)  # noqa: B010


def drain(timeout: float = 60) -> None:
    """Wait (outside any event loop) until Prefect's log and event workers have sent all
    they hold, then start them again here, outside any flow run.

    A worker keeps, for as long as the process lives, the context it was started in (its
    drain at the loop's shutdown is a call made in that context). Started again by the
    next row's first log line, it would keep that row's flow run, and every result the
    run returned: a whole fleet's worth of objects a row, for the collector to walk in
    every row after.
    """
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        done: object = worker.drain_all(timeout=timeout, at_exit=False)
        if isinstance(done, Awaitable):  # pragma: no cover - only inside a loop
            raise RuntimeError("drain() must be called outside an event loop")
    APILogWorker.instance()
    EventsWorker.instance()
