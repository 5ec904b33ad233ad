"""One client and one store per worker process, shared by every task and flow run in it.

Opening a client and a store in every task cost more than the turn it wrapped (a
TLS pool, a SQLite open and schema check, or a Postgres pool and a migration
check). Prefect's own integrations cache their clients the same way. A store
works from any event loop, so one per configuration serves the whole process; an
HTTP client belongs to the loop it was made on, so there is one per configuration
per loop. Everything is closed when the process exits.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import threading
import weakref
from collections.abc import Callable, Hashable

from coder_chat import ChatClient
from coder_chat.client.events import TransportCallback
from coder_chat.durable.store import DurableStore

_lock = threading.Lock()
_stores: dict[Hashable, DurableStore] = {}
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, ChatClient]] = (
    weakref.WeakKeyDictionary()
)


def shared_store(key: Hashable, open_store: Callable[[], DurableStore]) -> DurableStore:
    """The process's store for ``key``, opened on first use (again if it was closed)."""
    with _lock:
        store = _stores.get(key)
        if store is None or store.closed:
            store = _stores[key] = open_store()
        return store


def shared_client(
    base_url: str, token: str, on_transport_event: TransportCallback | None
) -> ChatClient:
    """This event loop's client for ``base_url`` and ``token``."""
    # The token picks the client but is kept only as a digest, so no map holds it.
    key = (base_url, hashlib.sha256(token.encode()).hexdigest())
    loop = asyncio.get_running_loop()
    with _lock:
        _forget_closed_loops()
        per_loop = _clients.setdefault(loop, {})
        client = per_loop.get(key)
        if client is None or client.closed:
            client = per_loop[key] = ChatClient(
                base_url=base_url, token=token, on_transport_event=on_transport_event
            )
        return client


def _forget_closed_loops() -> None:
    """Drop the clients of loops that are closed: nothing can use them any more, and a
    client's connections hold its loop, so the weak keys alone would never let go of
    either (a process that runs flows one event loop after another would keep them all)."""
    for loop in [loop for loop in _clients if loop.is_closed()]:
        del _clients[loop]


def _close_everything() -> None:
    """At exit: close the stores (SQLite's handles, Postgres' pools); sockets go with us."""
    with _lock:
        stores = list(_stores.values())
        _stores.clear()
    for store in stores:
        # Best effort: a pool whose loop is gone is released by the process exiting.
        with contextlib.suppress(Exception):
            asyncio.run(store.close())


atexit.register(_close_everything)
