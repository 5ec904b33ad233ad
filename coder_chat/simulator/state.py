"""The simulator's records: chats, messages, queued prompts, files.

Plain dataclasses holding wire-ready values; ``to_wire`` methods build the JSON
shapes of the wire reference (section 2). Message ids come from one global
counter shared by every chat, so a chat's ids increase but have gaps.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

JSON = dict[str, Any]

#: Statuses after which a turn no longer runs (``requires_action`` is a pause).
IDLE_STATUSES = frozenset({"waiting", "error"})


def now() -> datetime:
    return datetime.now(UTC)


def rfc3339(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


class Counters:
    """Id sources. Message ids are global; queue ids are a separate space."""

    def __init__(self) -> None:
        self._messages = itertools.count(1)
        self._queue = itertools.count(1)

    def message_id(self) -> int:
        return next(self._messages)

    def queue_id(self) -> int:
        return next(self._queue)


@dataclass
class Message:
    id: int
    chat_id: uuid.UUID
    role: str
    content: list[JSON]
    created_at: datetime = field(default_factory=now)
    usage: JSON | None = None
    created_by: uuid.UUID | None = None
    #: Model-only rows (system prompts) are never listed or streamed.
    visible: bool = True
    revision: int = 1

    def to_wire(self) -> JSON:
        out: JSON = {
            "id": self.id,
            "chat_id": str(self.chat_id),
            "created_at": rfc3339(self.created_at),
            "role": self.role,
            "content": self.content,
        }
        if self.created_by is not None:
            out["created_by"] = str(self.created_by)
        if self.usage is not None:
            out["usage"] = self.usage
        return out

    def text(self) -> str:
        return "".join(p.get("text", "") for p in self.content if p.get("type") == "text")


@dataclass
class QueuedMessage:
    id: int
    chat_id: uuid.UUID
    content: list[JSON]
    created_at: datetime = field(default_factory=now)
    #: The model it was sent with, if any: its turn runs on it once promoted.
    model_config_id: uuid.UUID | None = None

    def to_wire(self) -> JSON:
        out: JSON = {
            "id": self.id,
            "chat_id": str(self.chat_id),
            "content": self.content,
            "created_at": rfc3339(self.created_at),
        }
        if self.model_config_id is not None:
            out["model_config_id"] = str(self.model_config_id)
        return out


@dataclass
class PendingCall:
    """A client-tool call the chat is paused on."""

    tool_call_id: str
    tool_name: str
    args: Any

    def to_wire(self) -> JSON:
        import json

        return {
            "tool_call_id": self.tool_call_id,
            "tool_name": self.tool_name,
            "args": json.dumps(self.args),
        }


@dataclass
class StoredFile:
    id: uuid.UUID
    organization_id: uuid.UUID
    owner_id: uuid.UUID
    name: str
    mime_type: str
    data: bytes
    created_at: datetime = field(default_factory=now)

    def metadata(self) -> JSON:
        return {
            "id": str(self.id),
            "owner_id": str(self.owner_id),
            "organization_id": str(self.organization_id),
            "name": self.name,
            "mime_type": self.mime_type,
            "size_bytes": len(self.data),
            "created_at": rfc3339(self.created_at),
        }


@dataclass
class Chat:
    id: uuid.UUID
    organization_id: uuid.UUID
    owner_id: uuid.UUID
    owner_username: str
    title: str
    labels: dict[str, str]
    dynamic_tools: list[JSON]
    status: str = "running"
    archived: bool = False
    workspace_id: uuid.UUID | None = None
    mcp_server_ids: list[str] = field(default_factory=list)
    #: The model the last turn ran on (the default one unless a prompt named another).
    model_config_id: uuid.UUID | None = None
    system_prompt: str = ""
    plan_mode: str = ""
    client_type: str = "api"
    last_error: JSON | None = None
    created_at: datetime = field(default_factory=now)
    updated_at: datetime = field(default_factory=now)
    messages: list[Message] = field(default_factory=list)
    queue: list[QueuedMessage] = field(default_factory=list)
    files: list[StoredFile] = field(default_factory=list)
    pending_calls: list[PendingCall] = field(default_factory=list)
    # Versions the stream syncs on (wire reference section 5.3).
    history_version: int = 0
    queue_version: int = 0
    reset_epoch: int = 0
    generation_attempt: int = 0
    retry_version: int = 0
    retry_payload: JSON | None = None
    #: Deltas of the in-progress episode, replayed from seq 1 on reconnect.
    deltas: list[JSON] = field(default_factory=list)

    @property
    def episode(self) -> tuple[int, int]:
        return self.history_version, self.generation_attempt

    @property
    def busy(self) -> bool:
        return self.status not in IDLE_STATUSES

    def visible_messages(self) -> list[Message]:
        return [m for m in self.messages if m.visible]

    def message_by_id(self, message_id: int) -> Message | None:
        for message in self.messages:
            if message.id == message_id:
                return message
        return None

    def touch(self) -> None:
        self.updated_at = now()

    def to_wire(self, *, light: bool = False) -> JSON:
        out: JSON = {
            "id": str(self.id),
            "organization_id": str(self.organization_id),
            "owner_id": str(self.owner_id),
            "owner_username": self.owner_username,
            "root_chat_id": str(self.id),
            "title": self.title,
            "status": self.status,
            "plan_mode": self.plan_mode,
            "client_type": self.client_type,
            "created_at": rfc3339(self.created_at),
            "updated_at": rfc3339(self.updated_at),
            "archived": self.archived,
            "shared": False,
            "pin_order": 0,
            "has_unread": False,
            "mcp_server_ids": list(self.mcp_server_ids),
            "labels": dict(self.labels),
            "children": [],
            "queued_for_capacity": False,
        }
        if self.workspace_id is not None:
            out["workspace_id"] = str(self.workspace_id)
        if self.model_config_id is not None:
            out["last_model_config_id"] = str(self.model_config_id)
        if self.last_error is not None:
            out["last_error"] = self.last_error
        if not light:
            out["files"] = [f.metadata() for f in self.files]
        return out
