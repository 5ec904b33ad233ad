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
from ..protocol.usage import UsageTotals

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


def step_number(marker: str) -> int:
    """The step a marker names (``[trip-7/step-2]`` is 2); 0 for no marker."""
    found = _MARKER.fullmatch(marker)
    return int(found.group(2)) if found else 0


def marked(message: ChatMessage, marker: str) -> bool:
    return message.role == "user" and marker in message.text()


def earlier_step(message: ChatMessage, marker: str) -> bool:
    """Is ``message`` the prompt of an earlier step of ``marker``'s workflow?

    Past that step's own prompt, it is a send that landed late (the process that
    sent it died with it in flight, and the step was sent again and went on): it
    says nothing of the steps after it, which ran before it landed.
    """
    mine, theirs = _MARKER.fullmatch(marker), _MARKER.match(message.text().lstrip())
    return (
        message.role == "user"
        and mine is not None
        and theirs is not None
        and theirs.group(1) == mine.group(1)
        and int(theirs.group(2)) < int(mine.group(2))
    )


@dataclass
class StepHistory:
    """The tail of a chat's history back to (and including) a step's last prompt, or
    the whole history when the step's prompt is not in it."""

    marker: str
    messages: list[ChatMessage] = field(default_factory=list)  # oldest first

    @property
    def prompt(self) -> ChatMessage | None:
        """The step's last prompt in history (an earlier step's late prompt may follow it)."""
        return next((m for m in reversed(self.messages) if marked(m, self.marker)), None)

    def attempt(self, prompt: ChatMessage) -> list[ChatMessage]:
        """What Coder wrote for ``prompt``: the messages after it, up to the next prompt."""
        after = [m for m in self.messages if m.id > prompt.id]
        following = next((i for i, m in enumerate(after) if m.role == "user"), len(after))
        return after[:following]

    @property
    def last_id(self) -> int | None:
        """The newest message read, if any."""
        return self.messages[-1].id if self.messages else None

    def usage(self, after: int, upto: int | None) -> UsageTotals:
        """What the assistant messages read with ids in ``(after, upto]`` consumed."""
        top = upto if upto is not None else self.last_id or 0
        return UsageTotals.of(
            m.usage for m in self.messages if m.role == "assistant" and after < m.id <= top
        )

    def followed(self, prompt: ChatMessage) -> bool:
        """Did another prompt land after ``prompt``? Coder ran ``prompt``'s turn to its
        end before starting that one's, so the attempt read is whole."""
        return any(m.role == "user" and m.id > prompt.id for m in self.messages)


async def read_tail(
    client: ChatClient, chat_id: str, marker: str, since: int | None = None
) -> StepHistory:
    """Page newest-first until the step's last prompt is in hand, or history ends; and,
    given ``since``, until the messages after that id are all in hand too (0: all).

    "Never submitted" must never be concluded from a truncated read, so this keeps
    paging however long the turn was; and past an earlier step's prompt, which may
    be one that landed late after this step's (a recovery's read, so rare).
    """
    fetched: list[ChatMessage] = []
    before: int | None = None
    found = False
    while True:
        page = await client.get_messages(chat_id, before_id=before, limit=PAGE)
        fetched.extend(page.messages)
        found = found or any(marked(m, marker) for m in page.messages)
        reached = since is None or any(m.id <= since for m in page.messages)
        if not page.has_more or not page.messages or (found and reached):
            break
        before = min(m.id for m in page.messages)
    return StepHistory(marker, sorted(fetched, key=lambda m: m.id))


async def usage_after(client: ChatClient, chat_id: str, after: int) -> UsageTotals:
    """What the chat's assistant messages past id ``after`` consumed (oldest first, paged)."""
    messages: list[ChatMessage] = []
    while True:
        page = await client.get_messages(chat_id, after_id=after, limit=PAGE)
        messages.extend(page.messages)
        if not page.has_more or not page.messages:
            break
        after = max(m.id for m in page.messages)
    return UsageTotals.of(m.usage for m in messages if m.role == "assistant")


async def count_attempts(client: ChatClient, chat_id: str, marker: str) -> int:
    """User messages carrying ``marker``: the step's submitted attempts.

    Steps run in order, so a step's attempts sit together at the tail of history,
    but for an earlier step's prompt that landed late among them: page newest-first,
    pass those, and stop at the first other user message without ``marker``.
    """
    count = 0
    async for message in client.iter_messages(chat_id, page_size=PAGE):
        if message.role != "user" or earlier_step(message, marker):
            continue
        if marker not in message.text():
            return count
        count += 1
    return count
