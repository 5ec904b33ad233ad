"""Fenced before it reaches Coder: a superseded run sends nothing, submits nothing, archives
nothing.

The store's fencing stops a superseded run from *writing*; Coder knows nothing of
epochs, so a run cut off from the store (or frozen, or partitioned) that comes back
could still send a prompt, submit tool results, interrupt or archive a chat its
successor now drives. :class:`FenceGuard` is called before every such request and
raises :class:`~.store.FencedOut` once a newer run holds the workflow.

A check costs a store read, so a confirmation younger than ``fresh_for`` is taken as
it is: no run can take a workflow over that fast, since a takeover waits for the
heartbeat to go stale (seconds to minutes), and a fenced write or read that just
succeeded is such a confirmation. What no client-side check can close is a request
already on the wire when its run was cut off; that is the send in flight the journal's
commit horizon bounds.
"""

from __future__ import annotations

import time

from .records import Fence, WorkflowRecord
from .store import DurableStore, FencedOut


class FenceGuard:
    """Raises :class:`FencedOut` before an action when ``fence`` no longer holds."""

    def __init__(self, store: DurableStore, fence: Fence, fresh_for: float = 1.0) -> None:
        self.store = store
        self.fence = fence
        self.fresh_for = fresh_for
        self._confirmed_at = -float("inf")

    @property
    def fresh(self) -> bool:
        """Whether the fence was confirmed less than ``fresh_for`` seconds ago (an action
        now costs no store read)."""
        return time.monotonic() - self._confirmed_at < self.fresh_for

    def confirm(self) -> None:
        """The fence was just proven (a fenced write, or a read of the newest epoch)."""
        self._confirmed_at = time.monotonic()

    def confirm_epoch(self, newest: int | None) -> None:
        """A read showed the workflow's newest epoch: confirm, or raise if it moved on."""
        if not self.seen_holding(newest):
            raise FencedOut(self.fence, newest)

    def seen_holding(self, newest: int | None) -> bool:
        """Whether the fence holds at the workflow's ``newest`` epoch, just read (then it
        is confirmed): every answer of this guard is this one."""
        held = self.fence.holds(newest)
        if held:
            self.confirm()
        return held

    async def __call__(self, action: str) -> None:
        if self.fresh:
            return
        workflow = await self._read()
        self.confirm_epoch(workflow.epoch if workflow else None)

    async def newer(self) -> WorkflowRecord | None:
        """The workflow as the store holds it, if a newer epoch than this fence's holds
        it (a run took it over, or the sweep ended it); else ``None`` (a read). Epochs
        only grow, so any epoch but this fence's is a newer one."""
        workflow = await self._read()
        if workflow is None or self.seen_holding(workflow.epoch):
            return None
        return workflow

    async def holds(self) -> bool:
        """Whether this fence is still the workflow's newest epoch (a read)."""
        workflow = await self._read()
        return self.seen_holding(workflow.epoch if workflow else None)

    async def _read(self) -> WorkflowRecord | None:
        return await self.store.get_workflow(self.fence.tenant, self.fence.workflow_id)
