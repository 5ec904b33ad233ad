"""The durable records: what must survive a crash, and nothing more.

Every key carries the tenant (the Coder organization id), so one store can serve
several deployments without one tenant's entries answering another's. Values
are pydantic models stored as JSON. No record ever holds the session token or a
transcript: only ids, markers, states, times, and each finished step's answer
(:class:`StepRecord`), which is what makes the store, not a worker's result
cache, the record of progress. The one prompt kept is a finished step's own,
beside its answer, so that a later run sending another prompt for that step
can be refused with an error naming both.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import CoderConfigError, CoderStoreError
from ..protocol.usage import UsageTotals


def utcnow() -> datetime:
    return datetime.now(UTC)


class WorkflowState(StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    #: A person stopped it (cancelled its run, or ``prefect-coder workflows cancel``): its
    #: chat is archived and nothing relaunches it; ``resume`` carries it on.
    CANCELLED = "cancelled"
    #: It reached a limit (its budget's, or Coder's usage limit) and took no further turn:
    #: its chat is archived and nothing relaunches it; ``resume`` carries it on.
    OVER_BUDGET = "over-budget"


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AfterSteps(Record):
    """What the workflow's chat consumed past its last finished step's stretch, read when
    the workflow finished and archived it: a prompt of that step's that landed late, after
    it had finished, and ran. It counts while ``step`` is still the last finished step (a
    resumed workflow's next step counts that stretch as its own)."""

    step: int
    usage: UsageTotals


class WorkflowRecord(Record):
    """One workflow: its checkpoint, and who may act on it (the fencing epoch)."""

    tenant: str
    workflow_id: str
    #: The checkpoint: a pointer to the chat, never the chat itself.
    chat_id: str | None = None
    last_seen_message_id: int | None = None
    state: WorkflowState = WorkflowState.RUNNING
    deployment: str = "local"
    flow_run_id: str | None = None
    #: Taken anew by every run; a durable write needs the newest.
    epoch: int = 0
    heartbeat_at: datetime | None = None
    #: Whether the workflow archives its chat when it ends (the sweep finishes the job
    #: for an ended workflow whose archive did not happen, and only then).
    archive_at_end: bool = True
    #: What the workflow was told between its turns (a person's answer, in order): kept,
    #: so that a run that goes again is told the same and decides the same.
    inputs: list[Any] = Field(default_factory=list)
    #: Each patch this workflow met (``chat.patched(name)``) and what it decided: kept, so
    #: that every later run, on any machine, decides the same.
    patches: dict[str, bool] = Field(default_factory=dict)
    #: What its finished steps consumed, together: kept with each step, in the step's own
    #: transaction, so that a budget is checked from one read on any machine.
    spent: UsageTotals = Field(default_factory=UsageTotals)
    #: What the chat consumed after the last step, once the workflow finished.
    after_steps: AfterSteps | None = None
    updated_at: datetime = Field(default_factory=utcnow)

    def usage(self, steps: Sequence[StepRecord]) -> UsageTotals:
        """What the workflow consumed: its finished ``steps``, and what its chat ran after
        the last of them, if that was read when it finished (steps finished before usage
        was recorded count nothing)."""
        total = sum((s.usage for s in steps), UsageTotals())
        after = self.after_steps
        if after is not None and after.step == max((s.step for s in steps), default=0):
            total = total + after.usage
        return total


class Fence(Record):
    """Proof that a run holds a workflow's newest epoch; every durable write carries it."""

    tenant: str
    workflow_id: str
    epoch: int

    def holds(self, newest: int | None) -> bool:
        """The fencing rule, the one place it is written: a run may act while its epoch
        is the workflow's ``newest`` (``None``: the workflow is not there)."""
        return newest is not None and newest == self.epoch


RecoveryReason = Literal["hard_crash", "timeout", "abort"]
JournalState = Literal["submitting", "resumed", "cut-short"]


class JournalEntry(Record):
    """One attempt of one step on a chat. It classifies only the attempt it names."""

    state: JournalState
    marker: str
    attempt: int
    at: datetime = Field(default_factory=utcnow)
    #: Until when a send journaled ``submitting`` may still land (its own horizon).
    horizon: datetime | None = None
    #: Why recovery ran when this was written, so a later pass still pins cut-short.
    reason: RecoveryReason | None = None
    #: When a stop's interrupt was sent, or was about to be (the sender's clock), its
    #: outcome not known: journaled before the interrupt leaves (:mod:`.stops`). An
    #: attempt that Coder had finished before then was not cut by it.
    stopped_at: datetime | None = None


class ChatRecord(Record):
    """Per chat: the latest journal entry, and whether the chat was discarded."""

    tenant: str
    chat_id: str
    workflow_id: str
    journal: JournalEntry | None = None
    #: A chat dropped after a stream failure: never adopted, retired or swept.
    discarded: bool = False
    updated_at: datetime = Field(default_factory=utcnow)


StepVerdict = Literal["ran", "recovered", "resubmitted"]


class StepRecord(Record):
    """A finished step: written with its checkpoint, in one transaction, and read first.

    A re-run on any machine returns it instead of sending the step again. It holds
    the step's answer (text and structured output) and the prompt it answered, as
    the user gave it (without the step marker), with that prompt's digest.
    """

    tenant: str
    workflow_id: str
    step: int
    chat_id: str
    last_seen_message_id: int | None = None
    text: str
    output: Any = None
    #: How the step finished when it was run: its turn ran, was recovered, or resubmitted.
    verdict: StepVerdict
    #: sha256 of the step's prompt: a re-run with another prompt is refused, not answered.
    prompt_digest: str = ""
    #: The step's prompt as the user gave it, without the step marker, so that refusal
    #: can name both prompts. Steps finished before schema version 3 read back ``""``.
    prompt: str = ""
    notes: list[str] = Field(default_factory=list)
    #: What the step consumed: every assistant message in the chat between the step
    #: before's cursor and this one's, over all of its attempts (a crashed one recovered,
    #: a cut-short one and its resend), each counted once. Steps finished before schema
    #: version 6 read back zero.
    usage: UsageTotals = Field(default_factory=UsageTotals)
    finished_at: datetime = Field(default_factory=utcnow)


class StepView(Record):
    """What a step needs before it acts, read in one call, from one snapshot of the store
    (:meth:`~coder_chat.durable.store.DurableStore.get_step_view`).

    It replaces the separate reads of the step, its workflow, the checkpointed chat's
    journal and the step before it: every field is as it stood at one moment.
    """

    #: The step's own record if it finished before: returned from the store, never resent.
    step: StepRecord | None = None
    #: The workflow (None if it never began): its epoch, state and checkpoint, i.e. the chat
    #: the step goes on (``workflow.chat_id``) and the cursor (``last_seen_message_id``).
    workflow: WorkflowRecord | None = None
    #: The latest journal entry of the checkpointed chat (``workflow.chat_id``); None when
    #: there is no checkpoint, or nothing was ever journaled on that chat.
    journal: JournalEntry | None = None
    #: The chat on which the previous step (``step - 1``) finished, if it did; None for
    #: step 1 and before. A checkpointed chat equal to it was not created by this step.
    previous_chat_id: str | None = None
    #: Where the previous step's stretch of that chat ended (its cursor): this step's
    #: usage counts what came after it.
    previous_cursor: int | None = None


LedgerState = Literal["committing", "done"]


class LedgerEntry(Record):
    """A durable client tool's effect, keyed by ``(tenant, chat_id, tool_call_id)``."""

    tenant: str
    chat_id: str
    tool_call_id: str
    tool_name: str
    #: The step marker the call belongs to, and a hash of its arguments: a same-step,
    #: same-arguments call under a new id (after a server-side tool timeout) is
    #: answered from here instead of running the effect again.
    marker: str = ""
    args_digest: str = ""
    state: LedgerState = "committing"
    output: Any = None
    is_error: bool = False
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)

    @property
    def idempotency_key(self) -> str:
        return ledger_key(self.tenant, self.chat_id, self.tool_call_id)


def ledger_key(tenant: str, chat_id: str, tool_call_id: str) -> str:
    """The key handed to external systems as their idempotency key."""
    return f"{tenant}/{chat_id}/{tool_call_id}"


def prompt_digest(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()


def args_digest(args: Any) -> str:
    """A stable hash of tool arguments (canonical JSON)."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class PromptChanged(CoderConfigError):
    """A turn asked a finished step for another prompt than the one it ran.

    Workflow code runs again on every re-run and must decide the same way given the same
    answers; a finished step is never run again, so a changed prompt is refused, and the
    workflow's stored state is left as it was.
    """

    def __init__(
        self, workflow_id: str, step: int, ran: str | None, asked: str, *, finished: bool = True
    ) -> None:
        self.workflow_id = workflow_id
        self.step = step
        self.ran = ran
        self.asked = asked
        self.finished = finished
        earlier = f"it ran {_quoted(ran)}" if ran else "it ran another prompt"
        if finished:
            what = "already finished and is never run again"
        else:
            what = "was already sent with another prompt, and a step never changes its prompt"
            earlier = f"it was sent {_quoted(ran)}" if ran else "it was sent another prompt"
        super().__init__(
            f"step {step} of workflow {workflow_id!r} {what}: {earlier}, this run asked "
            f"{_quoted(asked)}. The flow's code must decide the same way on the same "
            "answers; use a new workflow id to run different prompts."
        )


def _quoted(prompt: str, limit: int = 160) -> str:
    flat = " ".join(prompt.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 1] + "…")


#: The schema version this code writes; a store holding a newer one is refused.
SCHEMA_VERSION = 6


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
