"""When to SIGKILL a run: a trigger per kill kind, reached through peers only.

``prime()`` arms what must be armed before the run is let go (a pause to hold);
a trigger's ``reached()`` returns at the kill moment (the caller races it against
the child's exit); ``after_kill()`` lets held requests go on once the process is
dead; ``disarm()`` undoes what an unreached trigger armed.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from coder_chat.durable.markers import LABEL_WORKFLOW
from coder_chat.durable.store import DurableStore
from coder_chat.errors import CoderStoreError
from coder_chat.simulator import Simulator
from coder_chat.simulator.state import Message
from tests.lab.steps import Kill
from tests.lab.truth import prompts

from .arena import REQUEST_TIMEOUT, Arena
from .gate import ChargeTarget

POLL = 0.01


async def prompts_landed(arena: Arena, workflow_id: str, count: int) -> list[Message]:
    """Wait until the workflow has ``count`` prompts in its chats; return them."""
    # History lives in the simulator's plain records, not behind an event: poll it.
    while len(found := prompts(arena.sim, workflow_id)) < count:  # noqa: ASYNC110
        await asyncio.sleep(POLL)
    return found


async def attempt_landed(arena: Arena, workflow_id: str, marker: str | None) -> None:
    """Wait for one more prompt carrying ``marker`` (forever when there is none)."""
    if marker is None:
        await asyncio.Future()
        return

    def count() -> int:
        return sum(1 for m in prompts(arena.sim, workflow_id) if marker in m.text())

    before = count()
    while count() <= before:  # noqa: ASYNC110 - plain records, as above
        await asyncio.sleep(POLL)


@dataclass
class Armed:
    """What a trigger set up to reach its kill: settled once the kill is made
    (``after_kill``), taken back when the run ended first (``disarm``)."""

    #: The tool call aimed at (an ``in-tool`` kill).
    target: ChargeTarget | None = None
    #: A hold placed on the next send, and the held request once it came.
    hold_placed: bool = False
    held_send: int | None = None
    #: The flow run whose pause for a person is held (a ``paused`` kill).
    paused_run: UUID | None = None


@dataclass
class Trigger:
    arena: Arena
    workflow_id: str
    kill: Kill
    #: The workflow's prompt count when the run was let go.
    baseline: int
    armed: Armed = field(default_factory=Armed)

    def prime(self) -> None:
        if self.kill.kind == "paused":
            self.arena.approvers[self.workflow_id].hold()

    async def reached(self) -> None:
        kind, kill = self.kill.kind, self.kill
        if kind == "moment":
            await asyncio.sleep(kill.delay)
        elif kind == "after-prompt":
            await prompts_landed(self.arena, self.workflow_id, self.baseline + kill.nth)
            await asyncio.sleep(kill.delay)
        elif kind == "in-tool":
            self.armed.target = self.arena.gate.aim(self.workflow_id, kill.nth, kill.phase)
            await self.armed.target.reached.wait()
        elif kind == "paused":
            self.armed.paused_run = await self.arena.approvers[self.workflow_id].held()
        else:
            await self._hold_next_send()

    async def _hold_next_send(self) -> None:
        landed = await prompts_landed(
            self.arena, self.workflow_id, max(1, self.baseline + self.kill.nth)
        )
        chat_id = str(landed[-1].chat_id)
        await self.arena.admin.hold_send(chat_id)
        self.armed.hold_placed = True
        while True:
            for held in await self.arena.admin.held():
                if held["route"] == "send_message" and held["chat_id"] == chat_id:
                    self.armed.held_send = int(held["id"])
                    return
            await asyncio.sleep(POLL)

    def after_kill(self, journaled: InFlight | None) -> None:
        if self.armed.target is not None:
            self.arena.gate.settle(self.armed.target)
        if self.kill.kind == "paused":
            self.arena.approvers[self.workflow_id].let_go(dead=self.armed.paused_run)
        if self.armed.held_send is not None:
            marker = journaled.marker if journaled else None
            late = self._release_late(self.armed.held_send, marker)
            self.arena.background.append(asyncio.create_task(late))

    async def _release_late(self, held_id: int, marker: str | None) -> None:
        """Let the dead process's send land only once a later run resubmitted its step
        (as the journal names it), or once it had all the time to: it lands late."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REQUEST_TIMEOUT + 4.0):
                await attempt_landed(self.arena, self.workflow_id, marker)
        await self.arena.admin.release(held_id)

    async def disarm(self) -> None:
        """The run ended before the kill: take back what the trigger armed."""
        if self.armed.target is not None:
            self.arena.gate.settle(self.armed.target)
        if self.kill.kind == "paused":
            self.arena.approvers[self.workflow_id].let_go()
        if self.armed.hold_placed and self.armed.held_send is None:
            # The admin routes remove rules only all at once: the schedule's remaining
            # knobs go with this one (noted).
            await self.arena.admin.clear()
            self.arena.notes.append(f"{self.workflow_id}: unreached held send cleared the knobs")


@dataclass(frozen=True)
class InFlight:
    """A send the journal shows in flight when its process died: written ``submitting``
    and not landed by then. It may land any time later, past its horizon."""

    chat_id: str
    marker: str
    horizon: datetime


async def in_flight(arena: Arena, workflow_id: str) -> InFlight | None:
    """Read the journal as the dead process left it (retrying a restarting store)."""
    for _ in range(40):
        try:
            return await read_in_flight(arena.sim, arena.store, arena.tenant, workflow_id)
        except CoderStoreError:
            await asyncio.sleep(0.25)
    arena.notes.append(f"{workflow_id}: the journal could not be read after a kill")
    return None


async def read_in_flight(
    sim: Simulator, store: DurableStore, tenant: str, workflow_id: str
) -> InFlight | None:
    """The send the workflow's journal shows in flight right now, if any."""
    chats = [c for c in sim.chats() if c.labels.get(LABEL_WORKFLOW) == workflow_id]
    for chat in chats:
        record = await store.get_chat(tenant, str(chat.id))
        entry = record.journal if record else None
        if entry is None or entry.state != "submitting" or entry.horizon is None:
            continue
        landed = sum(
            1 for m in sim.messages(chat.id) if m.role == "user" and entry.marker in m.text()
        )
        if landed == entry.attempt:
            return InFlight(str(chat.id), entry.marker, entry.horizon)
    return None
