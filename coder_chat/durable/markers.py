"""Step markers, chat labels, and what committed history says about a step's attempts.

A step's marker, ``[<workflow_id>/step-<n>]``, is embedded in its prompt. The
server stores prompts verbatim, so history tells which attempts of a step were
submitted; the marker is stable across the step's retries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..client.rest import ChatClient
from ..protocol.models import ChatMessage

LABEL_WORKFLOW = "prefect-coder/workflow"
LABEL_STEP = "prefect-coder/step"
LABEL_DEPLOYMENT = "prefect-coder/deployment"
#: The id of the store that owns the chat: a sweep acts only on its own store's chats.
LABEL_STORE = "prefect-coder/store"
PAGE = 200


def step_marker(workflow_id: str, step: int) -> str:
    return f"[{workflow_id}/step-{step}]"


def chat_labels(workflow_id: str, step: int, deployment: str, store_id: str) -> dict[str, str]:
    """Labels set at creation, so the sweep finds every chat, even one whose id was lost."""
    return {
        **owner_labels(deployment, store_id),
        LABEL_WORKFLOW: workflow_id[:256],
        LABEL_STEP: str(step),
    }


def owner_labels(deployment: str, store_id: str) -> dict[str, str]:
    """What every chat of one deployment and one store carries (the sweep's filter)."""
    return {LABEL_DEPLOYMENT: (deployment or "local")[:256], LABEL_STORE: store_id}


_MARKER = re.compile(r"\[(.+?)/step-(\d+)\]")


def marker_in(text: str) -> str | None:
    """The step marker a prompt starts with, if any."""
    found = _MARKER.match(text.lstrip())
    return found.group(0) if found else None


def marked(message: ChatMessage, marker: str) -> bool:
    return message.role == "user" and marker in message.text()


@dataclass
class StepHistory:
    """The tail of a chat's history back to (and including) the last user message."""

    messages: list[ChatMessage] = field(default_factory=list)  # oldest first

    @property
    def last_user(self) -> ChatMessage | None:
        return next((m for m in reversed(self.messages) if m.role == "user"), None)

    def after(self, message: ChatMessage) -> list[ChatMessage]:
        return [m for m in self.messages if m.id > message.id]


async def read_tail(client: ChatClient, chat_id: str) -> StepHistory:
    """Page newest-first until the last user message is in hand.

    "Never submitted" must never be concluded from a truncated read, so this
    keeps paging however long the turn was.
    """
    fetched: list[ChatMessage] = []
    before: int | None = None
    while True:
        page = await client.get_messages(chat_id, before_id=before, limit=PAGE)
        fetched.extend(page.messages)
        if any(m.role == "user" for m in page.messages) or not page.has_more or not page.messages:
            break
        before = min(m.id for m in page.messages)
    return StepHistory(sorted(fetched, key=lambda m: m.id))


async def count_attempts(client: ChatClient, chat_id: str, marker: str) -> int:
    """User messages carrying ``marker``: the step's submitted attempts.

    Steps run in order, so a step's attempts sit together at the tail of
    history: page newest-first and stop at the first user message without it.
    """
    count = 0
    async for message in client.iter_messages(chat_id, page_size=PAGE):
        if message.role != "user":
            continue
        if marker not in message.text():
            return count
        count += 1
    return count
