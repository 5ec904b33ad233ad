"""What every task and run works with: the process's shared client and store, and the
blocks that name them, checked; and retries for work done outside a task."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from coder_chat import ChatClient, CoderConfigError, is_retryable
from coder_chat.durable.store import DurableStore
from prefect_coder._run.logs import log_transport
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.settings import TaskSettings

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


Ledger = SqliteLedger | PostgresLedger


_LEDGERS: tuple[type[Ledger], ...] = (SqliteLedger, PostgresLedger)


@dataclass(frozen=True)
class Runtime:
    """What a task works with: the process's shared client and store, and the tenant."""

    client: ChatClient
    store: DurableStore
    tenant: str

    @classmethod
    def from_blocks(
        cls, credentials: CoderCredentials | None = None, ledger: Ledger | None = None
    ) -> Runtime:
        """The process's shared client and store for these blocks (``None``: the
        worker's environment, and the embedded SQLite store).

        Nothing here is closed by the caller: the process keeps one of each (see ``blocks``).
        """
        credentials, ledger = checked_blocks(credentials, ledger)
        credentials = credentials or CoderCredentials.from_environment()
        _, _, tenant = credentials.resolved()
        store = (ledger or SqliteLedger.default()).get_store()
        return cls(credentials.shared_client(on_transport_event=log_transport), store, tenant)


def checked_blocks(
    credentials: object, ledger: object
) -> tuple[CoderCredentials | None, Ledger | None]:
    """The blocks as given, or a :class:`CoderConfigError` that says what was given instead.

    Inside an async flow ``PostgresLedger.load("prod")`` returns a coroutine (Prefect's
    ``async_dispatch``): it is closed (no "never awaited" warning) and the error names the
    fix, rather than an ``AttributeError`` deep inside a task.
    """
    return (
        _checked_block("credentials", credentials, (CoderCredentials,)),
        _checked_block("ledger", ledger, _LEDGERS),
    )


def _checked_block(name: str, value: object, kinds: tuple[type[T], ...]) -> T | None:
    if value is None or isinstance(value, kinds):
        return value
    what = " or ".join(k.__name__ for k in kinds)
    if inspect.isawaitable(value):
        # A coroutine of ``Block.aload`` holds its class and the name (best effort).
        args = getattr(getattr(value, "cr_frame", None), "f_locals", {}).get("args")
        block, saved = args[:2] if isinstance(args, tuple) and len(args) >= 2 else (None, None)
        ok = isinstance(block, type) and issubclass(block, kinds)
        cls = block.__name__ if ok else kinds[-1].__name__
        called = repr(saved) if ok and isinstance(saved, str) else '"name"'
        if inspect.iscoroutine(value):
            value.close()
        raise CoderConfigError(
            f"{name} is a {type(value).__name__}, not a {what} block: inside an async flow, "
            f"load blocks with `await {cls}.aload({called})` (or `await {cls}.load(...)`)."
        )
    raise CoderConfigError(
        f"{name} is a {type(value).__name__} ({value!r:.60}), not a {what} block: pass a "
        f'loaded block (e.g. `await {kinds[-1].__name__}.aload("name")` in an async flow), '
        "or None for the worker's environment."
    )


#: The waits of work done outside a task (a run's begin and end) before each retry: the
#: tasks' own defaults, long enough to ride out a database restart or a burst of 5xx.
RETRY_DELAYS = TaskSettings().delays()


async def with_retries(
    what: Callable[[], Awaitable[T]], delays: Sequence[float] = RETRY_DELAYS
) -> T:
    """Call ``what`` again after each delay while it fails transiently (outside a task)."""
    for delay in delays:
        try:
            return await what()
        except Exception as exc:
            if not is_retryable(exc):
                raise
        await asyncio.sleep(delay)
    return await what()
