"""The domain rules of every durable store, written once.

A backend (:class:`~.sqlite.SqliteStore`, :class:`~.postgres.PostgresStore`) holds
the SQL, the connections, the transactions and the migrations, and checks the fence
in its own SQL by the rule of :func:`fence_holds`. This module decides what is read
and written: the fields a new run takes, the checkpoint a finished step leaves, a new
chat and a ledger entry's claim and outcome, and why a fenced write that matched
nothing was refused.

Every operation is an ``async def op(tx)`` over a :class:`Transaction`. The backend
runs it as one write (committed before the call returns) or as a read. An op awaits
nothing but its transaction's methods: SQLite runs it to completion on its own
thread, outside any event loop.

Every write is committed before it returns, so a killed process never loses one. Most
are also flushed to disk first, so that a machine that loses power does not lose them
either: above all the journal entry before a send and a tool's claim before its effect,
which keep an effect from being repeated. A few are not (:data:`UNFLUSHED`): a
backend may return before those reach the disk, because losing them with the machine
costs a recovery, never a repeat.

Each durable write is one call of a fenced write method (:class:`Transaction`): it
checks the fence and writes, or writes nothing. SQLite does that inside one
``BEGIN IMMEDIATE`` transaction; Postgres in one statement, one round trip. Only when
it wrote nothing does the op look again, to tell a run that lost the workflow
(:class:`FencedOut`, with the newest epoch) from a missing ledger entry.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import CoderConfigError, CoderStoreError
from ..protocol.usage import UsageTotals
from .records import (
    AfterSteps,
    ChatRecord,
    Fence,
    FencedOut,
    JournalEntry,
    LedgerEntry,
    StepRecord,
    StepView,
    WorkflowRecord,
    WorkflowState,
    utcnow,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

#: Field changes of one record, applied over the stored record as it is when the write
#: lands (top-level fields replaced whole, like ``model_copy(update=...)``).
Changes = dict[str, Any]

#: The states a workflow may be pruned in: it ended. A running workflow is never pruned.
ENDED_STATES = (
    WorkflowState.FINISHED,
    WorkflowState.FAILED,
    WorkflowState.CANCELLED,
    WorkflowState.OVER_BUDGET,
)
#: How the sweep's own records (one lease per deployment) begin: never pruned.
SWEEP_PREFIX = "prefect-coder-sweep"


@dataclass(frozen=True)
class PruneRule:
    """Which workflows a prune takes: of ``tenant``, in one of ``states`` (never running),
    last written before ``ended_before`` (their ``updated_at``: when they ended), of
    ``deployment`` when given, and never the sweep's own records (:data:`SWEEP_PREFIX`).
    A backend states the whole rule in its SQL, the refusals included."""

    tenant: str
    #: State names, none of them ``running``.
    states: tuple[str, ...]
    #: Aware, in UTC.
    ended_before: datetime
    deployment: str | None = None


@dataclass(frozen=True)
class WorkflowQuery:
    """Which workflows a listing reads: of ``tenant``, of ``deployment`` when given, in
    one of ``states`` (empty: every state), whose heartbeat is older than
    ``stale_before`` when given."""

    tenant: str
    deployment: str | None = None
    states: tuple[WorkflowState, ...] = ()
    stale_before: datetime | None = None


class Transaction(Protocol):
    """Reads and fenced writes of the store's rows, for one operation.

    A fenced write checks that its fence still holds the workflow's newest epoch and
    writes in the same step, so no new run can take the workflow in between; when the
    fence does not hold it writes nothing and returns ``None``. Rows that do not parse
    raise :class:`~coder_chat.errors.CoderStoreError` ("malformed row in <table>").
    """

    async def store_id(self) -> str | None: ...

    # -- reads
    async def workflow(self, tenant: str, workflow_id: str) -> WorkflowRecord | None: ...

    async def workflows(self, query: WorkflowQuery) -> list[WorkflowRecord]:
        """By workflow id (code-point order)."""
        ...

    async def chat(self, tenant: str, chat_id: str) -> ChatRecord | None: ...

    async def chats(self, tenant: str, discarded: bool | None) -> list[ChatRecord]:
        """By chat id (code-point order)."""
        ...

    async def tool(self, tenant: str, chat_id: str, tool_call_id: str) -> LedgerEntry | None: ...

    async def tools(self, tenant: str, chat_id: str) -> list[LedgerEntry]:
        """In the order they were claimed."""
        ...

    async def step(self, tenant: str, workflow_id: str, step: int) -> StepRecord | None: ...

    async def steps(self, tenant: str, workflow_id: str) -> list[StepRecord]:
        """By step number."""
        ...

    async def step_view(self, tenant: str, workflow_id: str, step: int) -> StepView:
        """Everything :class:`StepView` holds, from one snapshot (one statement)."""
        ...

    async def workflow_chats(self, tenant: str, workflow_id: str) -> list[ChatRecord]:
        """The chats journaled for one workflow, by chat id."""
        ...

    async def prunable(self, rule: PruneRule) -> list[WorkflowRecord]:
        """The workflows :meth:`prune` would delete now, by workflow id."""
        ...

    # -- writes
    async def start_run(self, new: WorkflowRecord, run: Changes) -> WorkflowRecord:
        """Insert ``new`` (epoch 1), or give the workflow there its next epoch and ``run``."""
        ...

    async def update_workflow(self, fence: Fence, changes: Changes) -> WorkflowRecord | None:
        """The workflow with ``changes``, or None (nothing written): the fence does not hold."""
        ...

    async def complete_step(
        self, fence: Fence, checkpoint: Changes, record: StepRecord
    ) -> WorkflowRecord | None:
        """The checkpoint and the step's row (inserted or replaced), both or neither."""
        ...

    async def upsert_chat(
        self, fence: Fence, new: ChatRecord, changes: Changes
    ) -> ChatRecord | None:
        """Insert ``new``, or apply ``changes`` to the chat there (racing writers lose nothing)."""
        ...

    async def claim_tool(
        self, fence: Fence, entry: LedgerEntry
    ) -> tuple[bool, LedgerEntry | None] | None:
        """Insert ``entry`` unless the call has one: ``(True, entry)``, or ``(False, held)``.

        ``held`` is the entry already there, or None when a racing writer committed it
        after this write's snapshot was taken (read it again to see it).
        """
        ...

    async def complete_tool(
        self, fence: Fence, chat_id: str, tool_call_id: str, changes: Changes
    ) -> LedgerEntry | None:
        """The entry with ``changes``; None when the fence does not hold or no entry exists."""
        ...

    async def prune(self, rule: PruneRule) -> list[str]:
        """Delete the workflows ``rule`` takes with their steps, their chats and the ledger
        entries of those chats (the chats journaled for them, their steps' chats and their
        checkpoint's), all or nothing; the ids deleted, by workflow id. Unfenced: it takes
        only ended workflows, which no run acts for."""
        ...


#: One operation of the store, run by a backend as one write (one commit) or as a read.
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


def step_view_of(
    step_body: Any,
    workflow_body: Any,
    chat_body: Any,
    previous_chat_id: str | None,
    previous_cursor: int | None,
) -> StepView:
    """A :class:`StepView` from the stored bodies a backend read in one statement."""
    chat = None if chat_body is None else parse_row(ChatRecord, chat_body, "chats")
    return StepView(
        step=None if step_body is None else parse_row(StepRecord, step_body, "steps"),
        workflow=(
            None if workflow_body is None else parse_row(WorkflowRecord, workflow_body, "workflows")
        ),
        journal=chat.journal if chat else None,
        previous_chat_id=previous_chat_id,
        previous_cursor=previous_cursor,
    )


#: Writes a machine's power loss may take back, when the backend can defer their flush:
#: a finished step (its journal entry stays, so the step recovers its answer from Coder
#: instead of sending again), a checkpoint (a chat is found again by its labels) and a
#: heartbeat. Any later flushed write flushes them too, so what a power loss takes is
#: always the last few writes, as if the machine had stopped just before them.
UNFLUSHED = frozenset({"complete_step", "save_checkpoint", "heartbeat"})


class DurableStore(ABC):
    """Checkpoints, finished steps, journal, discarded chats and the tool ledger: every
    method a durable store has, written once over a backend's transactions.

    A backend implements :meth:`_transact` (and :meth:`close`). Writes go through
    :meth:`_write`, which counts the commit in :attr:`commits` once it succeeded, and
    in :attr:`flushes` when it reached the disk before returning.
    """

    #: Write transactions this object has committed (tests and benchmarks count them):
    #: one per successful write call, counted after its commit; reads and schema
    #: migrations never count.
    commits: int
    #: Of those, the ones flushed to disk before they returned. The others (a finished
    #: step, a checkpoint, a heartbeat, in a store that defers them) survive a killed
    #: process too; only a machine that loses power may take them back, until a later
    #: flushed write or the system's own writeback makes them durable.
    flushes: int
    #: Whether writes asked not to flush return before reaching the disk.
    defers_flushes: ClassVar[bool] = False

    def __init__(self) -> None:
        self.commits = 0
        self.flushes = 0
        # The store may be used from several event loops, each on its own thread.
        self._commits_lock = threading.Lock()
        self._store_id: str | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (a closed store refuses every operation)."""
        return self._closed

    @abstractmethod
    async def _transact(self, doing: str, op: Op[T], *, write: bool, flush: bool = True) -> T:
        """Run ``op`` as one write, committed on return (``write``), or as a read.

        ``doing`` names the operation in error messages. A write with ``flush=False``
        may return before it reached the disk (see :data:`UNFLUSHED`), in a backend
        that :attr:`defers_flushes`.
        """

    @abstractmethod
    async def close(self) -> None: ...

    async def _write(self, doing: str, op: Op[T]) -> T:
        flush = doing not in UNFLUSHED
        result = await self._transact(doing, op, write=True, flush=flush)
        with self._commits_lock:
            self.commits += 1
            self.flushes += flush or not self.defers_flushes
        return result

    async def _read(self, doing: str, op: Op[T]) -> T:
        return await self._transact(doing, op, write=False)

    async def store_id(self) -> str:
        """The store's own id, made when it was created; the same in every process."""
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
        """Take the workflow's next epoch (creating it if new), mark it running, beat."""
        now = utcnow()
        run: Changes = {
            "state": WorkflowState.RUNNING,
            "deployment": deployment,
            "flow_run_id": flow_run_id,
            "archive_at_end": archive_at_end,
            "heartbeat_at": now,
            "updated_at": now,
        }
        new = WorkflowRecord(tenant=tenant, workflow_id=workflow_id, epoch=1).model_copy(update=run)

        async def op(tx: Transaction) -> Fence:
            return _fence_of(await tx.start_run(new, run))

        return await self._write("begin_run", op)

    async def get_workflow(self, tenant: str, workflow_id: str) -> WorkflowRecord | None:
        return await self._read("get_workflow", lambda tx: tx.workflow(tenant, workflow_id))

    async def _update_workflow(self, fence: Fence, changes: Changes, doing: str) -> None:
        touched = _touched(changes)

        async def op(tx: Transaction) -> None:
            if await tx.update_workflow(fence, touched) is None:
                raise await _refusal(tx, fence, doing)

        await self._write(doing, op)

    async def save_checkpoint(
        self, fence: Fence, chat_id: str, last_seen_message_id: int | None
    ) -> None:
        """The checkpoint ``(chat_id, last_seen_message_id)``."""
        checkpoint = {"chat_id": chat_id, "last_seen_message_id": last_seen_message_id}
        await self._update_workflow(fence, checkpoint, "save_checkpoint")

    async def clear_checkpoint(self, fence: Fence) -> None:
        checkpoint = {"chat_id": None, "last_seen_message_id": None}
        await self._update_workflow(fence, checkpoint, "clear_checkpoint")

    async def heartbeat(self, fence: Fence) -> None:
        await self._update_workflow(fence, {"heartbeat_at": utcnow()}, "heartbeat")

    async def finish(
        self, fence: Fence, state: WorkflowState, after_steps: AfterSteps | None = None
    ) -> None:
        """End the workflow in ``state``; ``after_steps``: what its chat ran past its last
        step, read once it was archived."""
        changes: dict[str, Any] = {"state": state}
        if after_steps is not None:
            changes["after_steps"] = after_steps
        await self._update_workflow(fence, changes, "finish")

    async def save_inputs(self, fence: Fence, inputs: Sequence[Any]) -> None:
        """What the workflow was told between turns, in order (JSON values), all of it."""
        await self._update_workflow(fence, {"inputs": list(inputs)}, "save_inputs")

    async def save_patches(self, fence: Fence, patches: Mapping[str, bool]) -> None:
        """Every patch the workflow met and what it decided, all of them."""
        await self._update_workflow(fence, {"patches": dict(patches)}, "save_patches")

    async def list_workflows(
        self,
        tenant: str,
        *,
        deployment: str | None = None,
        states: Sequence[WorkflowState] | None = None,
        stale_before: datetime | None = None,
    ) -> list[WorkflowRecord]:
        """Workflows by deployment and state; ``stale_before`` keeps those whose heartbeat is older."""
        query = WorkflowQuery(tenant, deployment, tuple(states or ()), stale_before)
        return await self._read(
            "list_workflows",
            lambda tx: tx.workflows(query),
        )

    # -- finished steps ------------------------------------------------------------------
    async def complete_step(
        self, fence: Fence, record: StepRecord, spent: UsageTotals | None = None
    ) -> None:
        """A finished step: its result and the checkpoint it leaves, in one transaction.

        The checkpoint becomes ``(record.chat_id, record.last_seen_message_id)``, and the
        workflow's ``spent`` what its steps consumed so far, this one's included (when
        given); the step's row is written (or replaced). Fenced like every durable write:
        a superseded run writes neither.
        """
        if (record.tenant, record.workflow_id) != (fence.tenant, fence.workflow_id):
            raise CoderConfigError(
                f"step {record.step} of workflow {record.workflow_id!r} (tenant "
                f"{record.tenant!r}) cannot be completed under a fence of {fence.workflow_id!r} "
                f"(tenant {fence.tenant!r})"
            )
        changes: Changes = {
            "chat_id": record.chat_id,
            "last_seen_message_id": record.last_seen_message_id,
        }
        if spent is not None:
            changes["spent"] = spent
        checkpoint = _touched(changes)

        async def op(tx: Transaction) -> None:
            if await tx.complete_step(fence, checkpoint, record) is None:
                raise await _refusal(tx, fence, "complete_step")

        await self._write("complete_step", op)

    async def get_step(self, tenant: str, workflow_id: str, step: int) -> StepRecord | None:
        return await self._read("get_step", lambda tx: tx.step(tenant, workflow_id, step))

    async def get_step_view(self, tenant: str, workflow_id: str, step: int) -> StepView:
        """Everything a step reads before it acts, in one read from one snapshot.

        It answers what :meth:`get_step`, :meth:`get_workflow`, :meth:`get_chat` (of the
        checkpointed chat) and :meth:`get_step` of ``step - 1`` would, in one call: one
        statement, one round trip on Postgres; one trip to the store's thread and one
        read transaction on SQLite. The fields (all None when absent):

        - ``step``: this step's :class:`StepRecord` if it finished before;
        - ``workflow``: the :class:`WorkflowRecord`, with the epoch, the state and the
          checkpoint (``chat_id``, ``last_seen_message_id``);
        - ``journal``: the latest :class:`JournalEntry` of the checkpointed chat;
        - ``previous_chat_id``: the chat on which step ``step - 1`` finished (None for
          step 1), and ``previous_cursor``, where that step's stretch of it ended.
        """
        return await self._read("get_step_view", lambda tx: tx.step_view(tenant, workflow_id, step))

    async def list_steps(self, tenant: str, workflow_id: str) -> list[StepRecord]:
        """The workflow's finished steps, by step number."""
        return await self._read("list_steps", lambda tx: tx.steps(tenant, workflow_id))

    # -- chats ---------------------------------------------------------------------------
    async def get_chat(self, tenant: str, chat_id: str) -> ChatRecord | None:
        return await self._read("get_chat", lambda tx: tx.chat(tenant, chat_id))

    async def _update_chat(self, fence: Fence, chat_id: str, changes: Changes, doing: str) -> None:
        touched = _touched(changes)
        new = ChatRecord(
            tenant=fence.tenant, chat_id=chat_id, workflow_id=fence.workflow_id
        ).model_copy(update=touched)

        async def op(tx: Transaction) -> None:
            if await tx.upsert_chat(fence, new, touched) is None:
                raise await _refusal(tx, fence, doing)

        await self._write(doing, op)

    async def write_journal(self, fence: Fence, chat_id: str, entry: JournalEntry) -> None:
        """Write-ahead of a send or a recovery verdict; replaces the chat's entry."""
        await self._update_chat(fence, chat_id, {"journal": entry}, "write_journal")

    async def mark_discarded(self, fence: Fence, chat_id: str) -> None:
        await self._update_chat(fence, chat_id, {"discarded": True}, "mark_discarded")

    async def list_chats(self, tenant: str, *, discarded: bool | None = None) -> list[ChatRecord]:
        return await self._read("list_chats", lambda tx: tx.chats(tenant, discarded))

    async def list_workflow_chats(self, tenant: str, workflow_id: str) -> list[ChatRecord]:
        """The chats journaled for one workflow (each with its latest journal entry)."""
        return await self._read(
            "list_workflow_chats", lambda tx: tx.workflow_chats(tenant, workflow_id)
        )

    # -- pruning ended workflows -----------------------------------------------------------
    async def list_prunable(
        self,
        tenant: str,
        *,
        ended_before: datetime,
        states: Sequence[WorkflowState | str] | None = None,
        deployment: str | None = None,
    ) -> list[WorkflowRecord]:
        """What :meth:`prune_workflows` would delete now, by workflow id (a read)."""
        rule = prune_rule(tenant, ended_before, states, deployment)
        return await self._read("list_prunable", lambda tx: tx.prunable(rule))

    async def prune_workflows(
        self,
        tenant: str,
        *,
        ended_before: datetime,
        states: Sequence[WorkflowState | str] | None = None,
        deployment: str | None = None,
    ) -> list[str]:
        """Delete ended workflows last written before ``ended_before``, in one write.

        ``states`` default to every ended state (finished, failed, cancelled); ``running`` is
        refused (:class:`~coder_chat.errors.CoderConfigError`), and the store's own SQL never
        takes a running workflow nor the sweep's records (``prefect-coder-sweep…``) whatever
        it is asked. With each workflow go its finished steps, its chats' journal rows and
        the tool ledger entries of every chat it names. Returns the ids deleted, sorted.
        """
        rule = prune_rule(tenant, ended_before, states, deployment)
        return await self._write("prune_workflows", lambda tx: tx.prune(rule))

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
        """Write ``committing`` unless an entry exists; exactly one racing writer wins.

        Returns ``(won, entry)``: the new entry, or the one already there.
        """
        entry = LedgerEntry(
            tenant=fence.tenant,
            chat_id=chat_id,
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            marker=marker,
            args_digest=args_digest,
        )

        async def op(tx: Transaction) -> tuple[bool, LedgerEntry]:
            claimed = await tx.claim_tool(fence, entry)
            if claimed is None:
                raise await _refusal(tx, fence, "claim_tool")
            won, held = claimed
            if held is None:  # the racing winner committed after our snapshot: look again
                held = await tx.tool(fence.tenant, chat_id, tool_call_id)
            if held is None:
                raise CoderStoreError(
                    f"{self!r}: ledger entry {tool_call_id} of chat {chat_id} conflicted "
                    "but cannot be read"
                )
            return won, held

        return await self._write("claim_tool", op)

    async def complete_tool(
        self, fence: Fence, chat_id: str, tool_call_id: str, *, output: Any, is_error: bool = False
    ) -> LedgerEntry:
        outcome = _touched({"state": "done", "output": output, "is_error": is_error})

        async def op(tx: Transaction) -> LedgerEntry:
            done = await tx.complete_tool(fence, chat_id, tool_call_id, outcome)
            if done is not None:
                return done
            if (refused := await _fenced_out(tx, fence)) is not None:
                raise refused
            raise CoderStoreError(f"no ledger entry for tool call {tool_call_id} of chat {chat_id}")

        return await self._write("complete_tool", op)

    async def get_tool(self, tenant: str, chat_id: str, tool_call_id: str) -> LedgerEntry | None:
        return await self._read("get_tool", lambda tx: tx.tool(tenant, chat_id, tool_call_id))

    async def list_tools(self, tenant: str, chat_id: str) -> list[LedgerEntry]:
        return await self._read("list_tools", lambda tx: tx.tools(tenant, chat_id))


# -- the rules ----------------------------------------------------------------------------


def prune_rule(
    tenant: str,
    ended_before: datetime,
    states: Sequence[WorkflowState | str] | None,
    deployment: str | None,
) -> PruneRule:
    """The rule of a prune; ``states`` default to every ended state. Asking for running
    workflows, or giving a time without its zone, is refused."""
    try:
        chosen = [WorkflowState(s) for s in (states or ENDED_STATES)]
    except ValueError as exc:
        raise CoderConfigError(f"cannot prune workflows: {exc}") from None
    if WorkflowState.RUNNING in chosen:
        raise CoderConfigError(
            "a running workflow is never pruned: choose among "
            + ", ".join(str(s) for s in ENDED_STATES)
        )
    if ended_before.tzinfo is None or ended_before.utcoffset() is None:
        raise CoderConfigError(f"ended_before needs a time zone (got {ended_before.isoformat()})")
    return PruneRule(
        tenant=tenant,
        states=tuple(dict.fromkeys(str(s) for s in chosen)),
        ended_before=ended_before.astimezone(UTC),
        deployment=deployment,
    )


def fence_holds(fence: Fence, epoch: int | None) -> bool:
    """The fencing rule (:meth:`Fence.holds`), as the backends' SQL checks it."""
    return fence.holds(epoch)


async def _fenced_out(tx: Transaction, fence: Fence) -> FencedOut | None:
    """A second look, taken only after a fenced write matched nothing: :class:`FencedOut`
    (with the newest epoch) when the fence no longer holds, else None."""
    current = await tx.workflow(fence.tenant, fence.workflow_id)
    epoch = current.epoch if current else None
    return None if fence_holds(fence, epoch) else FencedOut(fence, epoch)


async def _refusal(tx: Transaction, fence: Fence, doing: str) -> CoderStoreError:
    """Why a fenced write of the workflow, a step or a chat wrote nothing."""
    refused = await _fenced_out(tx, fence)
    if refused is not None:
        return refused
    # A fence from begin_run names a workflow that exists from then on with epochs that only
    # grow, so this takes a fence that was never handed out, racing that workflow's creation.
    return CoderStoreError(
        f"{doing}: workflow {fence.workflow_id!r} did not hold epoch {fence.epoch} when written, "
        "and holds it now; try again",
        retryable=True,
    )


def _touched(changes: Changes) -> Changes:
    return {**changes, "updated_at": utcnow()}


def _fence_of(record: WorkflowRecord) -> Fence:
    return Fence(tenant=record.tenant, workflow_id=record.workflow_id, epoch=record.epoch)
