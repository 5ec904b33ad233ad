"""What the lab watches while a schedule plays: each workflow's progress in the store.

The lab reads the store from the bridge, which no fault cuts; while the store
itself restarts, a read fails and the last answer stands. Moments (:mod:`.plan`)
wait on what this sees: a step finished, an epoch taken, the run that holds a
workflow (and, through the witness, the host it runs on).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from coder_chat.durable.records import WorkflowRecord, WorkflowState
from coder_chat.durable.store import DurableStore
from coder_chat.errors import CoderError

from .witness import Witness

POLL = 0.3


@dataclass
class Progress:
    record: WorkflowRecord | None = None
    steps_done: int = 0


@dataclass
class Observer:
    store: DurableStore
    tenant: str
    workflow_ids: list[str]
    witness: Witness
    progress: dict[str, Progress] = field(default_factory=dict)
    #: When a read of the store last failed, and how (kept for :meth:`describe`).
    failed_at: float = 0.0
    failure: str = ""

    async def watch(self) -> None:
        while True:
            for workflow_id in self.workflow_ids:
                try:
                    await self._look(workflow_id)
                except (CoderError, OSError) as exc:
                    self.failed_at = time.monotonic()
                    self.failure = " ".join(f"{type(exc).__name__}: {exc}".split())
            await asyncio.sleep(POLL)

    async def _look(self, workflow_id: str) -> None:
        record = await self.store.get_workflow(self.tenant, workflow_id)
        steps = await self.store.list_steps(self.tenant, workflow_id)
        self.progress[workflow_id] = Progress(record, len(steps))

    def describe(self) -> str:
        """Each workflow as the store last told it, and the store's last failed read: what
        a person watching a long wait needs to see."""
        parts = [self._describe_one(w) for w in self.workflow_ids]
        if self.failure:
            ago = time.monotonic() - self.failed_at
            parts.append(f"last failed read of the store {ago:.0f}s ago: {self.failure[:200]}")
        return "; ".join(parts)

    def _describe_one(self, workflow_id: str) -> str:
        progress = self.progress.get(workflow_id, Progress())
        record = progress.record
        if record is None:
            return f"{workflow_id} not begun"
        where = self.host_of(workflow_id) or "no host seen"
        return (
            f"{workflow_id} {record.state.value} at epoch {record.epoch}, "
            f"{progress.steps_done} steps, held by run {(record.flow_run_id or '?')[:8]} on {where}"
        )

    def epoch(self, workflow_id: str) -> int:
        record = self.progress.get(workflow_id, Progress()).record
        return record.epoch if record else 0

    def steps_done(self, workflow_id: str) -> int:
        return self.progress.get(workflow_id, Progress()).steps_done

    def ended(self, workflow_id: str) -> bool:
        record = self.progress.get(workflow_id, Progress()).record
        return record is not None and record.state != WorkflowState.RUNNING

    def holder(self, workflow_id: str) -> str | None:
        """The flow run that holds the workflow's newest epoch."""
        record = self.progress.get(workflow_id, Progress()).record
        return record.flow_run_id if record else None

    def host_of(self, workflow_id: str) -> str | None:
        """The worker host whose processes run the workflow's holder, as last seen."""
        holder = self.holder(workflow_id)
        seen = self.witness.runs.get(holder or "")
        return seen.host if seen else None

    async def until(self, check: str, workflow_id: str, number: int) -> None:
        """Wait until the workflow has finished ``number`` steps (``step``) or taken
        epoch ``number`` (``epoch``); also returns once the workflow has ended."""
        while not self.ended(workflow_id):
            reached = self.steps_done if check == "step" else self.epoch
            if reached(workflow_id) >= number:
                return
            await asyncio.sleep(POLL)
