"""What every task needs: blocks resolved by name, tools by import path, the retry rule."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from prefect.blocks.core import Block
from prefect.client.schemas.objects import State, TaskRun
from prefect.context import TaskRunContext
from prefect.tasks import Task
from pydantic import BaseModel

from blocks import CoderCredentials, PostgresLedger, SqliteLedger
from coder_chat import ChatClient, CoderConfigError, is_retryable
from coder_chat.client.events import TransportEvent, WsEvent
from coder_chat.durable.store import DurableStore
from coder_chat.durable.tools import DurableTool

T = TypeVar("T")


async def load_credentials(block_name: str | None) -> CoderCredentials:
    """The named credentials block, or credentials from the environment."""
    if not block_name:
        return CoderCredentials()
    block = await CoderCredentials.aload(block_name)
    assert isinstance(block, CoderCredentials)
    return block


async def load_ledger(block_name: str | None) -> SqliteLedger | PostgresLedger:
    """The named ledger block (``slug/name`` or a SqliteLedger name), or the embedded default."""
    if not block_name:
        return SqliteLedger()
    block = (
        await Block.aload(block_name) if "/" in block_name else await SqliteLedger.aload(block_name)
    )
    if not isinstance(block, SqliteLedger | PostgresLedger):
        raise CoderConfigError(f"block {block_name!r} is not a Coder ledger block")
    return block


@contextlib.asynccontextmanager
async def connected(
    credentials_block: str | None,
    ledger_block: str | None,
    log: Callable[[str], None] | None = None,
) -> AsyncIterator[tuple[ChatClient, DurableStore, str]]:
    """A client and an open store for one task; both closed when it ends."""
    credentials = await load_credentials(credentials_block)
    _, _, tenant = credentials.resolved()
    store = (await load_ledger(ledger_block)).get_store()
    client = credentials.get_client(on_transport_event=transport_logger(log) if log else None)
    try:
        yield client, store, tenant
    finally:
        await client.aclose()
        await store.close()


def transport_logger(log: Callable[[str], None]) -> Callable[[TransportEvent], None]:
    """Transport events as task-run log lines (per-event stream traffic is left out)."""

    def emit(event: TransportEvent) -> None:
        if isinstance(event, WsEvent):
            return
        fields = {k: v for k, v in vars(event).items() if k != "type" and v is not None}
        log(f"{event.type} " + " ".join(f"{k}={v}" for k, v in fields.items()))

    return emit


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


def import_tools(paths: list[str]) -> list[Any]:
    tools = [import_object(p) for p in paths]
    for path, tool in zip(paths, tools, strict=True):
        if not isinstance(tool, DurableTool) and not asyncio.iscoroutinefunction(tool):
            raise CoderConfigError(f"{path} is neither a durable tool nor an async function")
    return tools


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


def step_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """Ids only (tenant, workflow, step, a hash of the prompt): a re-run of the same
    workflow skips its finished steps."""
    digest = hashlib.sha256(str(parameters["prompt"]).encode()).hexdigest()[:16]
    tenant = parameters["tenant"]
    return f"prefect-coder/{tenant}/{parameters['workflow_id']}/step-{parameters['step']}/{digest}"
