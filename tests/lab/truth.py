"""Ground truth from the simulator: a workflow's chats, its steps' attempts, their answers.

Message ids come from one global counter, so sorting by id orders messages of
several chats by when the server committed them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from coder_chat.durable.markers import LABEL_WORKFLOW, step_marker
from coder_chat.protocol.models import Usage
from coder_chat.protocol.usage import UsageTotals
from coder_chat.simulator import Simulator
from coder_chat.simulator.state import Chat, Message, now

from .tasks import in_background

#: The client tools a campaign chat declares: an answer is the text after the last call.
CLIENT_TOOLS = frozenset({"charge_card", "issue_refund", "structured_output"})


def workflow_chats(sim: Simulator, workflow_id: str) -> list[Chat]:
    return [c for c in sim.chats() if c.labels.get(LABEL_WORKFLOW) == workflow_id]


def committed_usage(chats: Iterable[Chat]) -> UsageTotals:
    """What the assistant messages the simulator committed on ``chats`` reported, summed:
    what a durable workflow's recorded usage must equal."""
    return UsageTotals.of(
        None if m.usage is None else Usage.model_validate(m.usage)
        for chat in chats
        for m in chat.messages
        if m.role == "assistant"
    )


def prompts(sim: Simulator, workflow_id: str) -> list[Message]:
    """Every user message of the workflow's chats, oldest first."""
    found = [
        m
        for c in workflow_chats(sim, workflow_id)
        for m in c.visible_messages()
        if m.role == "user"
    ]
    return sorted(found, key=lambda m: m.id)


def attempts(sim: Simulator, workflow_id: str, step: int) -> list[Message]:
    """The step's submitted attempts: user messages carrying its marker, in any chat."""
    marker = step_marker(workflow_id, step)
    return [m for m in prompts(sim, workflow_id) if marker in m.text()]


def answer_parts(sim: Simulator, user: Message) -> list[Message]:
    """The assistant messages the server committed after ``user``, up to the next prompt."""
    later = [m for m in sim.messages(user.chat_id) if m.id > user.id]
    nxt = next((m.id for m in later if m.role == "user"), None)
    return [m for m in later if m.role == "assistant" and (nxt is None or m.id < nxt)]


def reply_to(sim: Simulator, user: Message, until: datetime | None = None) -> str:
    """What the server committed as the answer to ``user`` (by ``until``): the final
    text after the last client-tool call, as the client computes it."""
    parts = [
        p
        for m in answer_parts(sim, user)
        if until is None or m.created_at <= until
        for p in m.content
    ]
    return text_after_tools(parts, CLIENT_TOOLS)


def text_after_tools(parts: list[dict[str, Any]], tools: frozenset[str]) -> str:
    """The text of an answer's parts after its last call of a client tool (the turn's
    reply: what came before the call was cut short by it and resent after its result)."""
    cut = 0
    for index, part in enumerate(parts):
        if part.get("type") == "tool-call" and part.get("tool_name") in tools:
            cut = index + 1
    return "".join(str(p.get("text", "")) for p in parts[cut:] if p.get("type") == "text")


def call_step(sim: Simulator, workflow_id: str, chat_id: str, tool_call_id: str) -> int | None:
    """The step whose attempt made the client-tool call ``tool_call_id``."""
    messages = sim.messages(chat_id)
    call = next(
        (
            m
            for m in messages
            if any(p.get("tool_call_id") == tool_call_id for p in m.content)
            and m.role == "assistant"
        ),
        None,
    )
    if call is None:
        return None
    user = next((m for m in reversed(messages) if m.role == "user" and m.id < call.id), None)
    text = user.text() if user else ""
    return next(
        (n for n in range(1, 100) if step_marker(workflow_id, n) in text),
        None,
    )


@dataclass
class StatusLog:
    """When chats were seen in ``error``: the server records no time for a failed turn,
    so a poller keeps it (an errored attempt may be resubmitted)."""

    errors: dict[str, list[datetime]] = field(default_factory=dict)
    _last: dict[str, str] = field(default_factory=dict)

    def errored_between(self, chat_id: str, start: datetime, end: datetime) -> bool:
        return any(start <= t <= end for t in self.errors.get(chat_id, []))

    async def poll(self, sim: Simulator, interval: float = 0.02) -> None:
        while True:
            for chat in sim.chats():
                chat_id = str(chat.id)
                if chat.status == "error" and self._last.get(chat_id) != "error":
                    self.errors.setdefault(chat_id, []).append(now())
                self._last[chat_id] = chat.status
            await asyncio.sleep(interval)

    @contextlib.asynccontextmanager
    async def polling(self, sim: Simulator) -> AsyncIterator[None]:
        async with in_background(self.poll(sim)):
            yield
