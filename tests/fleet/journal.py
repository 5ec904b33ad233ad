"""Sends in flight when a host was hit: the one window the contract leaves open.

A journal entry ``submitting`` whose attempt count equals the attempts already in
the chat names a send that has not landed yet. When its host is killed or cut
off, that send may still land later (a packet retransmitted once a cut heals), past
its horizon: a duplicate prompt the resends check then counts as *late*, not as a
finished step sent again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from coder_chat.durable.store import DurableStore

from .fleet import Fleet
from .truth import read_truth


@dataclass(frozen=True)
class InFlight:
    workflow_id: str
    chat_id: str
    marker: str
    horizon: datetime

    def describe(self) -> str:
        return f"{self.marker} on chat {self.chat_id} (horizon {self.horizon:%H:%M:%S})"


async def in_flight(fleet: Fleet, store: DurableStore, workflow_id: str) -> list[InFlight]:
    """The workflow's sends that the journal shows in flight now."""
    coder = fleet.coder
    assert coder is not None
    truth = await read_truth(coder.url, coder.token)
    found = []
    for chat in truth.workflow_chats(workflow_id):
        record = await store.get_chat(coder.organization_id, chat.id)
        entry = record.journal if record else None
        if entry is None or entry.state != "submitting" or entry.horizon is None:
            continue
        landed = sum(1 for m in chat.messages if m.role == "user" and entry.marker in m.text())
        if landed == entry.attempt:
            found.append(InFlight(workflow_id, chat.id, entry.marker, entry.horizon))
    return found
