"""Ground truth from the simulator, read over its admin routes (``/simulator/v1/records``).

The simulator runs on the Coder host, in another process: the lab sees what it
holds as JSON (every chat with every message, hidden rows included, and the
interrupts, archives and tool results it accepted), parsed here into small
frozen records with the questions the checks ask of them. Message ids come from
one global counter, so sorting by id orders messages of several chats by when
the server committed them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from coder_chat.durable.markers import LABEL_WORKFLOW, step_marker
from coder_chat.protocol.models import Usage
from coder_chat.protocol.usage import UsageTotals
from tests.lab.truth import text_after_tools

#: The client tools a lab chat declares: a step's answer is the text after the last call.
CLIENT_TOOLS = frozenset({"charge_card", "structured_output"})


@dataclass(frozen=True)
class Message:
    id: int
    chat_id: str
    role: str
    content: tuple[dict[str, Any], ...]
    created_at: datetime
    #: The usage Coder reported on an assistant message (the model step's).
    usage: dict[str, Any] | None = None

    def text(self) -> str:
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")


@dataclass(frozen=True)
class ChatTruth:
    id: str
    status: str
    archived: bool
    labels: dict[str, str]
    created_at: datetime
    messages: tuple[Message, ...]


@dataclass(frozen=True)
class Accepted:
    """An interrupt, archive or tool result the server accepted, and when."""

    kind: str
    chat_id: str
    at: datetime
    http_status: int = 200
    tool_call_id: str = ""
    tool_name: str = ""
    output: Any = None
    synthetic: bool = False


@dataclass(frozen=True)
class Truth:
    chats: dict[str, ChatTruth]
    interrupts: tuple[Accepted, ...]
    archives: tuple[Accepted, ...]
    tool_results: tuple[Accepted, ...]

    def workflow_chats(self, workflow_id: str) -> list[ChatTruth]:
        return [c for c in self.chats.values() if c.labels.get(LABEL_WORKFLOW) == workflow_id]

    def usage(self, workflow_id: str) -> UsageTotals:
        """What the assistant messages of the workflow's chats reported, summed."""
        return UsageTotals.of(
            None if m.usage is None else Usage.model_validate(m.usage)
            for c in self.workflow_chats(workflow_id)
            for m in c.messages
            if m.role == "assistant"
        )

    def prompts(self, workflow_id: str) -> list[Message]:
        """Every user message of the workflow's chats, oldest first."""
        found = [
            m for c in self.workflow_chats(workflow_id) for m in c.messages if m.role == "user"
        ]
        return sorted(found, key=lambda m: m.id)

    def attempts(self, workflow_id: str, step: int) -> list[Message]:
        marker = step_marker(workflow_id, step)
        return [m for m in self.prompts(workflow_id) if marker in m.text()]

    def reply_to(self, user: Message, until: datetime | None = None) -> str:
        """What the server committed as the answer to ``user`` (by ``until``): the final
        text after the last client-tool call, as the client computes it."""
        later = [m for m in self.chats[user.chat_id].messages if m.id > user.id]
        nxt = next((m.id for m in later if m.role == "user"), None)
        parts = [
            p
            for m in later
            if m.role == "assistant" and (nxt is None or m.id < nxt)
            if until is None or m.created_at <= until
            for p in m.content
        ]
        return text_after_tools(parts, CLIENT_TOOLS)

    def call_step(self, chat_id: str, tool_call_id: str) -> int | None:
        """The step whose attempt made the client-tool call ``tool_call_id``."""
        chat = self.chats.get(chat_id)
        if chat is None:
            return None
        workflow_id = chat.labels.get(LABEL_WORKFLOW, "")
        call = next(
            (
                m
                for m in chat.messages
                if m.role == "assistant"
                and any(p.get("tool_call_id") == tool_call_id for p in m.content)
            ),
            None,
        )
        if call is None:
            return None
        user = next(
            (m for m in reversed(chat.messages) if m.role == "user" and m.id < call.id), None
        )
        text = user.text() if user else ""
        return next((n for n in range(1, 100) if step_marker(workflow_id, n) in text), None)


async def read_truth(base_url: str, token: str) -> Truth:
    async with httpx.AsyncClient(
        base_url=f"{base_url}/simulator/v1", headers={"Coder-Session-Token": token}, timeout=60
    ) as http:

        async def records(kind: str) -> list[dict[str, Any]]:
            response = await http.get(f"/records/{kind}")
            response.raise_for_status()
            found: list[dict[str, Any]] = response.json()
            return found

        chats = {c["id"]: _chat(c) for c in await records("chats")}
        interrupts = tuple(_accepted("interrupt", r) for r in await records("interrupts"))
        archives = tuple(
            _accepted("archive", r) for r in await records("archives") if r["archived"]
        )
        results = tuple(_accepted("tool result", r) for r in await records("tool-results"))
    return Truth(chats, interrupts, archives, results)


def _chat(raw: dict[str, Any]) -> ChatTruth:
    messages = tuple(
        Message(
            m["id"],
            raw["id"],
            m["role"],
            tuple(m["content"]),
            _time(m["created_at"]),
            m.get("usage"),
        )
        for m in raw["messages"]
        if m.get("visible", True)
    )
    return ChatTruth(
        raw["id"], raw["status"], raw["archived"], raw["labels"], _time(raw["created_at"]), messages
    )


def _accepted(kind: str, raw: dict[str, Any]) -> Accepted:
    return Accepted(
        kind,
        raw["chat_id"],
        _time(raw["at"]),
        int(raw.get("http_status", 200)),
        raw.get("tool_call_id", ""),
        raw.get("tool_name", ""),
        raw.get("output"),
        bool(raw.get("synthetic", False)),
    )


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)
