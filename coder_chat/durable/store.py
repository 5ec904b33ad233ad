"""The store protocol every durable backend implements (SQLite, Postgres).

Writes are durable when they return (committed, synced). Writes that act for a
workflow run take its :class:`Fence` and succeed only while that run still holds
the workflow's newest epoch; otherwise they raise :class:`FencedOut`, so a run
that wakes after being superseded can never act.

Each store has an id (:meth:`DurableStore.store_id`), made once when the store is
created and the same for every process that opens it: chats are labelled with it,
so a sweep acts only on the chats of its own store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from ..errors import CoderStoreError
from .records import (
    ChatRecord,
    Fence,
    JournalEntry,
    LedgerEntry,
    StepRecord,
    StepView,
    WorkflowRecord,
    WorkflowState,
)

#: The schema version this code writes; a store holding a newer one is refused.
SCHEMA_VERSION = 5


class FencedOut(CoderStoreError):
    """A newer run took the workflow: this run must stop acting."""

    def __init__(self, fence: Fence, current: int | None) -> None:
        self.fence = fence
        self.current = current
        super().__init__(
            f"workflow {fence.workflow_id!r}: epoch {fence.epoch} was superseded "
            f"(newest is {current}); this run may no longer act",
            retryable=False,
        )

    def __reduce__(self) -> tuple[object, ...]:
        # Keep the type through pickling (Prefect persists a failed task's exception).
        return (FencedOut, (self.fence, self.current))


@runtime_checkable
class DurableStore(Protocol):
    """Checkpoints, finished steps, journal, discarded chats and the tool ledger."""

    #: Write transactions this object has committed (tests and benchmarks count them):
    #: one per successful write call, counted after its commit; reads and schema
    #: migrations never count.
    commits: int
    #: Of those, the ones flushed to disk before they returned. The others (a finished
    #: step, a checkpoint, a heartbeat, in a store that defers them) survive a killed
    #: process too; only a machine that loses power may take them back, until a later
    #: flushed write or the system's own writeback makes them durable.
    flushes: int

    async def store_id(self) -> str:
        """The store's own id, made when it was created; the same in every process."""
        ...

    # -- workflows -----------------------------------------------------------------
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
        ...

    async def get_workflow(self, tenant: str, workflow_id: str) -> WorkflowRecord | None: ...

    async def save_checkpoint(
        self, fence: Fence, chat_id: str, last_seen_message_id: int | None
    ) -> None:
        """The checkpoint ``(chat_id, last_seen_message_id)``."""
        ...

    async def clear_checkpoint(self, fence: Fence) -> None: ...

    async def complete_step(self, fence: Fence, record: StepRecord) -> None:
        """A finished step: its result and the checkpoint it leaves, in one transaction.

        The checkpoint becomes ``(record.chat_id, record.last_seen_message_id)``; the
        step's row is written (or replaced). Fenced like every durable write: a
        superseded run writes neither.
        """
        ...

    async def get_step(self, tenant: str, workflow_id: str, step: int) -> StepRecord | None: ...

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
          step 1).
        """
        ...

    async def list_steps(self, tenant: str, workflow_id: str) -> list[StepRecord]:
        """The workflow's finished steps, by step number."""
        ...

    async def heartbeat(self, fence: Fence) -> None: ...

    async def save_inputs(self, fence: Fence, inputs: Sequence[Any]) -> None:
        """What the workflow was told between turns, in order (JSON values), all of it."""
        ...

    async def save_patches(self, fence: Fence, patches: Mapping[str, bool]) -> None:
        """Every patch the workflow met and what it decided, all of them."""
        ...

    async def finish(self, fence: Fence, state: WorkflowState) -> None: ...

    async def list_workflows(
        self,
        tenant: str,
        *,
        deployment: str | None = None,
        states: Sequence[WorkflowState] | None = None,
        stale_before: datetime | None = None,
    ) -> list[WorkflowRecord]:
        """Workflows by deployment and state; ``stale_before`` keeps those whose heartbeat is older."""
        ...

    # -- chats: journal and discards --------------------------------------------------------
    async def get_chat(self, tenant: str, chat_id: str) -> ChatRecord | None: ...

    async def write_journal(self, fence: Fence, chat_id: str, entry: JournalEntry) -> None:
        """Write-ahead of a send or a recovery verdict; replaces the chat's entry."""
        ...

    async def mark_discarded(self, fence: Fence, chat_id: str) -> None: ...

    async def list_chats(
        self, tenant: str, *, discarded: bool | None = None
    ) -> list[ChatRecord]: ...

    async def list_workflow_chats(self, tenant: str, workflow_id: str) -> list[ChatRecord]:
        """The chats journaled for one workflow (each with its latest journal entry)."""
        ...

    # -- pruning ended workflows ---------------------------------------------------------------
    async def list_prunable(
        self,
        tenant: str,
        *,
        ended_before: datetime,
        states: Sequence[WorkflowState | str] | None = None,
        deployment: str | None = None,
    ) -> list[WorkflowRecord]:
        """What :meth:`prune_workflows` would delete now, by workflow id (a read)."""
        ...

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
        ...

    # -- the tool ledger ---------------------------------------------------------------------
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
        ...

    async def complete_tool(
        self, fence: Fence, chat_id: str, tool_call_id: str, *, output: Any, is_error: bool = False
    ) -> LedgerEntry: ...

    async def get_tool(
        self, tenant: str, chat_id: str, tool_call_id: str
    ) -> LedgerEntry | None: ...

    async def list_tools(self, tenant: str, chat_id: str) -> list[LedgerEntry]: ...

    async def close(self) -> None: ...

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (a closed store refuses every operation)."""
        ...
