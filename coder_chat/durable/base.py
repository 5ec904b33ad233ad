"""The domain rules of every durable store, written once.

A backend (:class:`~.sqlite.SqliteStore`, :class:`~.postgres.PostgresStore`) holds
the SQL, the connections, the transactions and the migrations. This module decides
what is read and written: the next epoch, the fencing check, the upsert of a chat,
claiming and completing a ledger entry, a finished step with its checkpoint.

Every operation is an ``async def op(tx)`` over a :class:`Transaction`. The backend
runs it in one transaction (a write, committed before the call returns) or on one
connection (a read). An op awaits nothing but its transaction's methods: SQLite
runs it to completion on its own thread, outside any event loop.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import CoderConfigError, CoderStoreError
from .records import (
    ChatRecord,
    Fence,
    JournalEntry,
    LedgerEntry,
    StepRecord,
    WorkflowRecord,
    WorkflowState,
    utcnow,
)
from .store import FencedOut

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
R = TypeVar("R", WorkflowRecord, ChatRecord, LedgerEntry)

#: How a read locks its row until the transaction ends: ``update`` (exclusive: this
#: transaction writes the row), ``share`` (the row must not change under us), or not.
#: SQLite ignores it: ``BEGIN IMMEDIATE`` already holds the whole file.
Lock = Literal["share", "update"] | None


class Transaction(Protocol):
    """Row-level reads and writes inside one transaction (or on one connection, for reads).

    ``insert_*`` returns False when the row exists already (a racing writer committed
    it first) and changes nothing. Rows that do not parse raise
    :class:`~coder_chat.errors.CoderStoreError` ("malformed row in <table>").
    """

    async def store_id(self) -> str | None: ...

    async def workflow(
        self, tenant: str, workflow_id: str, *, lock: Lock = None
    ) -> WorkflowRecord | None: ...

    async def insert_workflow(self, record: WorkflowRecord) -> bool: ...

    async def update_workflow(self, record: WorkflowRecord) -> None: ...

    async def workflows(
        self,
        tenant: str,
        deployment: str | None,
        states: Sequence[WorkflowState],
        stale_before: datetime | None,
    ) -> list[WorkflowRecord]:
        """By workflow id (code-point order); empty ``states`` means every state."""
        ...

    async def chat(self, tenant: str, chat_id: str, *, lock: Lock = None) -> ChatRecord | None: ...

    async def insert_chat(self, record: ChatRecord) -> bool: ...

    async def update_chat(self, record: ChatRecord) -> None: ...

    async def chats(self, tenant: str, discarded: bool | None) -> list[ChatRecord]:
        """By chat id (code-point order)."""
        ...

    async def tool(
        self, tenant: str, chat_id: str, tool_call_id: str, *, lock: Lock = None
    ) -> LedgerEntry | None: ...

    async def insert_tool(self, entry: LedgerEntry) -> bool: ...

    async def update_tool(self, entry: LedgerEntry) -> None: ...

    async def tools(self, tenant: str, chat_id: str) -> list[LedgerEntry]:
        """In the order they were claimed."""
        ...

    async def step(self, tenant: str, workflow_id: str, step: int) -> StepRecord | None: ...

    async def put_step(self, record: StepRecord) -> None:
        """Insert the step's row, or replace the one there."""
        ...

    async def steps(self, tenant: str, workflow_id: str) -> list[StepRecord]:
        """By step number."""
        ...


#: One operation of the store, run by a backend inside one transaction.
Op = Callable[[Transaction], Coroutine[Any, Any, T]]


def parse_row(model: type[M], body: Any, table: str) -> M:
    """A stored JSON body as its record; a malformed one is reported, never skipped."""
    try:
        return model.model_validate_json(body)
    except (ValidationError, TypeError) as exc:
        count = exc.error_count() if isinstance(exc, ValidationError) else 1
        raise CoderStoreError(
            f"malformed row in {table}: {count} problem(s): {str(body)[:200]!r}"
        ) from None


class BaseStore(ABC):
    """Every method of :class:`~.store.DurableStore`, over a backend's transactions.

    A subclass implements :meth:`_transact` (and :meth:`close`). Writes go through
    :meth:`_write`, which counts the commit in :attr:`commits` once it succeeded.
    """

    #: Write transactions this object has committed (migrations are not counted).
    commits: int

    def __init__(self) -> None:
        self.commits = 0
        # The store may be used from several event loops, each on its own thread.
        self._commits_lock = threading.Lock()
        self._store_id: str | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @abstractmethod
    async def _transact(self, doing: str, op: Op[T], *, write: bool) -> T:
        """Run ``op`` in one transaction, committed on return (``write``), or as a read.

        ``doing`` names the operation in error messages.
        """

    @abstractmethod
    async def close(self) -> None: ...

    async def _write(self, doing: str, op: Op[T]) -> T:
        result = await self._transact(doing, op, write=True)
        with self._commits_lock:
            self.commits += 1
        return result

    async def _read(self, doing: str, op: Op[T]) -> T:
        return await self._transact(doing, op, write=False)

    async def store_id(self) -> str:
        if self._store_id is None:
            found = await self._read("store_id", lambda tx: tx.store_id())
            if found is None:
                raise CoderStoreError(f"{self!r} has no store id (its meta table is empty)")
            self._store_id = found
        return self._store_id

    # -- workflows -----------------------------------------------------------------------
    async def begin_run(
        self,
        tenant: str,
        workflow_id: str,
        *,
        deployment: str = "local",
        flow_run_id: str | None = None,
        archive_at_end: bool = True,
    ) -> Fence:
        run = {
            "state": WorkflowState.RUNNING,
            "deployment": deployment,
            "flow_run_id": flow_run_id,
            "archive_at_end": archive_at_end,
        }

        async def op(tx: Transaction) -> Fence:
            current = await tx.workflow(tenant, workflow_id, lock="update")
            if current is None:
                record = _next_run(WorkflowRecord(tenant=tenant, workflow_id=workflow_id), run)
                if await tx.insert_workflow(record):
                    return _fence_of(record)
                # A racing begin_run created it first (and has committed): take the next epoch.
                current = await tx.workflow(tenant, workflow_id, lock="update")
                if current is None:
                    raise CoderStoreError(f"{self!r}: workflow {workflow_id!r} vanished")
            record = _next_run(current, run)
            await tx.update_workflow(record)
            return _fence_of(record)

        return await self._write("begin_run", op)

    async def get_workflow(self, tenant: str, workflow_id: str) -> WorkflowRecord | None:
        return await self._read("get_workflow", lambda tx: tx.workflow(tenant, workflow_id))

    async def _update_workflow(self, fence: Fence, changes: dict[str, Any], doing: str) -> None:
        async def op(tx: Transaction) -> None:
            current = await _fenced(tx, fence, lock="update")
            await tx.update_workflow(_touched(current, changes))

        await self._write(doing, op)

    async def save_checkpoint(
        self, fence: Fence, chat_id: str, last_seen_message_id: int | None
    ) -> None:
        checkpoint = {"chat_id": chat_id, "last_seen_message_id": last_seen_message_id}
        await self._update_workflow(fence, checkpoint, "save_checkpoint")

    async def clear_checkpoint(self, fence: Fence) -> None:
        checkpoint = {"chat_id": None, "last_seen_message_id": None}
        await self._update_workflow(fence, checkpoint, "clear_checkpoint")

    async def heartbeat(self, fence: Fence) -> None:
        await self._update_workflow(fence, {"heartbeat_at": utcnow()}, "heartbeat")

    async def finish(self, fence: Fence, state: WorkflowState) -> None:
        await self._update_workflow(fence, {"state": state}, "finish")

    async def list_workflows(
        self,
        tenant: str,
        *,
        deployment: str | None = None,
        states: Sequence[WorkflowState] | None = None,
        stale_before: datetime | None = None,
    ) -> list[WorkflowRecord]:
        return await self._read(
            "list_workflows",
            lambda tx: tx.workflows(tenant, deployment, states or (), stale_before),
        )

    # -- finished steps ------------------------------------------------------------------
    async def complete_step(self, fence: Fence, record: StepRecord) -> None:
        if (record.tenant, record.workflow_id) != (fence.tenant, fence.workflow_id):
            raise CoderConfigError(
                f"step {record.step} of workflow {record.workflow_id!r} (tenant "
                f"{record.tenant!r}) cannot be completed under a fence of {fence.workflow_id!r} "
                f"(tenant {fence.tenant!r})"
            )
        checkpoint = {
            "chat_id": record.chat_id,
            "last_seen_message_id": record.last_seen_message_id,
        }

        async def op(tx: Transaction) -> None:
            current = await _fenced(tx, fence, lock="update")
            await tx.update_workflow(_touched(current, checkpoint))
            await tx.put_step(record)

        await self._write("complete_step", op)

    async def get_step(self, tenant: str, workflow_id: str, step: int) -> StepRecord | None:
        return await self._read("get_step", lambda tx: tx.step(tenant, workflow_id, step))

    async def list_steps(self, tenant: str, workflow_id: str) -> list[StepRecord]:
        return await self._read("list_steps", lambda tx: tx.steps(tenant, workflow_id))

    # -- chats ---------------------------------------------------------------------------
    async def get_chat(self, tenant: str, chat_id: str) -> ChatRecord | None:
        return await self._read("get_chat", lambda tx: tx.chat(tenant, chat_id))

    async def _update_chat(
        self, fence: Fence, chat_id: str, changes: dict[str, Any], doing: str
    ) -> None:
        new = ChatRecord(tenant=fence.tenant, chat_id=chat_id, workflow_id=fence.workflow_id)

        async def op(tx: Transaction) -> None:
            await _fenced(tx, fence, lock="share")
            for _ in range(2):
                current = await tx.chat(fence.tenant, chat_id, lock="update")
                record = _touched(current or new, changes)
                if current is not None:
                    await tx.update_chat(record)
                    return
                if await tx.insert_chat(record):
                    return
                # A racing writer created the chat first (and has committed): update it.
            raise CoderStoreError(f"{self!r}: chat {chat_id} vanished")

        await self._write(doing, op)

    async def write_journal(self, fence: Fence, chat_id: str, entry: JournalEntry) -> None:
        await self._update_chat(fence, chat_id, {"journal": entry}, "write_journal")

    async def mark_discarded(self, fence: Fence, chat_id: str) -> None:
        await self._update_chat(fence, chat_id, {"discarded": True}, "mark_discarded")

    async def list_chats(self, tenant: str, *, discarded: bool | None = None) -> list[ChatRecord]:
        return await self._read("list_chats", lambda tx: tx.chats(tenant, discarded))

    # -- the tool ledger -----------------------------------------------------------------
    async def claim_tool(
        self,
        fence: Fence,
        chat_id: str,
        tool_call_id: str,
        *,
        tool_name: str,
        marker: str = "",
        args_digest: str = "",
    ) -> tuple[bool, LedgerEntry]:
        entry = LedgerEntry(
            tenant=fence.tenant,
            chat_id=chat_id,
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            marker=marker,
            args_digest=args_digest,
        )

        async def op(tx: Transaction) -> tuple[bool, LedgerEntry]:
            await _fenced(tx, fence, lock="share")
            if await tx.insert_tool(entry):
                return True, entry
            existing = await tx.tool(fence.tenant, chat_id, tool_call_id)
            if existing is None:
                raise CoderStoreError(
                    f"{self!r}: ledger entry {tool_call_id} of chat {chat_id} conflicted "
                    "but cannot be read"
                )
            return False, existing

        return await self._write("claim_tool", op)

    async def complete_tool(
        self, fence: Fence, chat_id: str, tool_call_id: str, *, output: Any, is_error: bool = False
    ) -> LedgerEntry:
        outcome = {"state": "done", "output": output, "is_error": is_error}

        async def op(tx: Transaction) -> LedgerEntry:
            await _fenced(tx, fence, lock="share")
            current = await tx.tool(fence.tenant, chat_id, tool_call_id, lock="update")
            if current is None:
                raise CoderStoreError(
                    f"no ledger entry for tool call {tool_call_id} of chat {chat_id}"
                )
            done = _touched(current, outcome)
            await tx.update_tool(done)
            return done

        return await self._write("complete_tool", op)

    async def get_tool(self, tenant: str, chat_id: str, tool_call_id: str) -> LedgerEntry | None:
        return await self._read("get_tool", lambda tx: tx.tool(tenant, chat_id, tool_call_id))

    async def list_tools(self, tenant: str, chat_id: str) -> list[LedgerEntry]:
        return await self._read("list_tools", lambda tx: tx.tools(tenant, chat_id))


# -- the rules ----------------------------------------------------------------------------


async def _fenced(tx: Transaction, fence: Fence, *, lock: Lock) -> WorkflowRecord:
    """The workflow, if ``fence`` still holds its newest epoch; else :class:`FencedOut`.

    The lock keeps the epoch from changing before the transaction commits.
    """
    current = await tx.workflow(fence.tenant, fence.workflow_id, lock=lock)
    if current is None or current.epoch != fence.epoch:
        raise FencedOut(fence, current.epoch if current else None)
    return current


def _next_run(base: WorkflowRecord, run: dict[str, Any]) -> WorkflowRecord:
    """The workflow taken by a new run: the next epoch, running, with a fresh heartbeat."""
    now = utcnow()
    return base.model_copy(
        update={**run, "epoch": base.epoch + 1, "heartbeat_at": now, "updated_at": now}
    )


def _touched(record: R, changes: dict[str, Any]) -> R:
    return record.model_copy(update={**changes, "updated_at": utcnow()})


def _fence_of(record: WorkflowRecord) -> Fence:
    return Fence(tenant=record.tenant, workflow_id=record.workflow_id, epoch=record.epoch)
