"""What every task needs: the shared client and store, tools by import path, the retry rule."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun
from prefect.context import TaskRunContext
from prefect.exceptions import MissingContextError
from prefect.logging.handlers import APILogHandler
from prefect.logging.loggers import LoggingAdapter, PrefectLogAdapter
from prefect.tasks import Task, TaskRunNameValueOrCallable
from prefect.utilities.annotations import NotSet
from pydantic import BaseModel

from coder_chat import ChatClient, CoderConfigError, is_retryable
from coder_chat.client.events import TransportEvent, WsEvent
from coder_chat.client.tools import ToolFunction
from coder_chat.durable.context import StepTools
from coder_chat.durable.store import DurableStore
from coder_chat.durable.tools import DurableTool
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger

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


def runtime(credentials: CoderCredentials | None, ledger: Ledger | None) -> Runtime:
    """The shared client and store for these blocks (the environment's when ``None``).

    Nothing here is closed by the task: the process keeps one of each (see ``blocks``).
    """
    credentials, ledger = checked_blocks(credentials, ledger)
    credentials = credentials or CoderCredentials.from_environment()
    _, _, tenant = credentials.resolved()
    store = (ledger or SqliteLedger.default()).get_store()
    return Runtime(credentials.shared_client(on_transport_event=log_transport), store, tenant)


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


def run_log() -> LoggingAdapter:
    """The run's logger, named ``prefect.{flow,task}_runs.coder`` so our lines stand apart
    from Prefect's own (they reach the run's logs the same way)."""
    adapter = get_run_logger()
    assert isinstance(adapter, logging.LoggerAdapter)
    own = logging.getLogger(f"{adapter.logger.name}.coder")
    return PrefectLogAdapter(own, adapter.extra)


def story_log() -> LoggingAdapter:
    """Where a turn's story is told: the run's log in Prefect (what the UI shows), and not
    the console: a line costs a step about 0.7 ms through both, most of it in the console's
    handler, and a turn tells a line or more."""
    adapter = get_run_logger()
    assert isinstance(adapter, logging.LoggerAdapter)
    own = logging.getLogger(f"{adapter.logger.name}.coder.story")
    if own.propagate:
        own.handlers = [h for h in adapter.logger.handlers if isinstance(h, APILogHandler)]
        own.propagate = not own.handlers  # no API handler configured: as every other line
    return PrefectLogAdapter(own, adapter.extra)


#: Where transport lines go (a task run's, as the turns run in tasks); when that logger
#: keeps no DEBUG line, an event costs one check and nothing is formatted.
_TRANSPORT_LOGGER = logging.getLogger("prefect.task_runs.coder")


def log_transport(event: TransportEvent) -> None:
    """A transport event as a DEBUG line of the run it happened in (stream traffic left out)."""
    if isinstance(event, WsEvent) or not _TRANSPORT_LOGGER.isEnabledFor(logging.DEBUG):
        return
    try:
        log = run_log()
    except MissingContextError:
        return
    fields: dict[str, object] = {}
    for name, value in vars(event).items():
        if name == "duration" and isinstance(value, float):
            fields["duration_ms"] = round(value * 1000, 1)
        elif name != "type" and value is not None:
            fields[name] = value
    note = _EXPECTED_CONFLICTS.get(str(fields.get("op"))) if fields.get("status") == 409 else None
    line = f"{event.type} " + " ".join(f"{k}={v}" for k, v in fields.items())
    log.debug(f"{line} ({note})" if note else line)


#: 409s that are part of the normal path, said in words where they are logged.
_EXPECTED_CONFLICTS = {
    "update_chat": "expected: Coder refuses to archive while a stopped run winds down; retried",
    "interrupt_chat": "expected: nothing was running, so there was nothing to interrupt",
}


def import_object(path: str) -> Any:
    """``module:attribute`` → the object (how tools and output schemas are chosen in the UI)."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise CoderConfigError(f"{path!r} is not an import path of the form module:attribute")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CoderConfigError(f"cannot import {module_name!r} for {path!r}: {exc}") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise CoderConfigError(f"{module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


#: A client tool as a flow names it: the object, or its import path (``module:function``).
ToolLike = DurableTool | ToolFunction | str


def import_tools(paths: Sequence[str]) -> list[Any]:
    tools = [import_object(p) for p in paths]
    for path, tool in zip(paths, tools, strict=True):
        if not isinstance(tool, DurableTool) and not asyncio.iscoroutinefunction(tool):
            raise CoderConfigError(f"{path} is neither a durable tool nor an async function")
    return tools


def resolve_tools(tools: Sequence[ToolLike], *, allow_plain: bool = False) -> StepTools:
    """A workflow's client tools, imported where given by path and checked: once per run."""
    resolved = [import_tools([t])[0] if isinstance(t, str) else t for t in tools]
    return StepTools.build(resolved, allow_plain=allow_plain)


def import_model(path: str | None) -> type[BaseModel] | None:
    if not path:
        return None
    model = import_object(path)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise CoderConfigError(f"{path} is not a pydantic model")
    return model


#: Prefect's retries for tasks that touch the store or Coder: long enough to ride out
#: a database restart or a burst of 5xx, and only for failures judged transient.
RETRY_DELAYS = [1.0, 5.0, 15.0]


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


async def retry_if_transient(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Prefect's retry condition: retry only what :func:`is_retryable` calls transient."""
    try:
        await state.aresult()
    except Exception as exc:  # noqa: BLE001 - judged, not swallowed: the state stays failed
        return is_retryable(exc)
    return False


def durable_task(
    *,
    name: str,
    task_run_name: TaskRunNameValueOrCallable,
    cache_key_fn: Callable[[TaskRunContext, dict[str, Any]], str] | None = None,
) -> Callable[[Callable[P, R]], Task[P, R]]:
    """Every task of ours: retried on what :func:`is_retryable` calls transient, with the
    same delays. With ``cache_key_fn`` its result is persisted (JSON) under that key;
    without it nothing is cached, so Prefect never hashes a task's inputs."""
    cached = cache_key_fn is not None
    return task(
        name=name,
        task_run_name=task_run_name,
        retries=len(RETRY_DELAYS),
        retry_delay_seconds=RETRY_DELAYS,
        retry_condition_fn=retry_if_transient,
        cache_key_fn=cache_key_fn,
        cache_policy=NotSet if cached else NO_CACHE,
        persist_result=True if cached else None,
        result_serializer="json" if cached else None,
    )
