"""Typed models of Coder's chat API wire data (wire reference section 2).

Parsed at the boundary and used everywhere after; unknown fields are ignored so
a newer server does not break an older client. Field names keep the wire's
snake_case.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

#: Statuses that end a segment (``requires_action`` is a pause for client tools).
TERMINAL_STATUSES = frozenset({"waiting", "completed", "error", "requires_action"})
#: Statuses in which nothing is generating.
IDLE_STATUSES = frozenset({"waiting", "completed", "error"})


class WireModel(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Usage(WireModel):
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    reasoning_tokens: int | None = None
    cache_creation_tokens: int | None = None
    cache_read_tokens: int | None = None
    context_limit: int | None = None
    #: What the step cost and how long it ran, where the server reports them (the
    #: reference SDK reads both; the Go structs read so far do not define them).
    total_cost_micros: int | None = None
    total_runtime_ms: int | None = None


class ChatMessagePart(WireModel):
    """One part of a message; which fields are set depends on ``type``."""

    type: str
    text: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    args: Any = None
    args_delta: str | None = None
    result: Any = None
    result_delta: str | None = None
    result_reset: bool | None = None
    is_error: bool | None = None
    provider_executed: bool | None = None
    media_type: str | None = None
    file_id: str | None = None
    name: str | None = None


def text_of(parts: list[ChatMessagePart]) -> str:
    """The text parts of a message's content, joined."""
    return "".join(p.text or "" for p in parts if p.type == "text")


class ChatMessage(WireModel):
    id: int
    chat_id: str
    role: Literal["user", "assistant", "tool", "system"] | str
    content: list[ChatMessagePart] = Field(default_factory=list)
    created_at: datetime | None = None
    created_by: str | None = None
    model_config_id: str | None = None
    usage: Usage | None = None

    def text(self) -> str:
        return text_of(self.content)


class ChatErrorInfo(WireModel):
    """The server's ``last_error`` / ``error`` payload."""

    message: str = "The chat request failed unexpectedly."
    detail: str | None = None
    kind: str = "generic"
    provider: str | None = None
    retryable: bool = False
    status_code: int | None = None


class QueuedMessage(WireModel):
    id: int
    chat_id: str
    content: list[ChatMessagePart] = Field(default_factory=list)
    created_at: datetime | None = None

    def text(self) -> str:
        return text_of(self.content)


class Chat(WireModel):
    id: str
    organization_id: str | None = None
    owner_id: str | None = None
    workspace_id: str | None = None
    title: str = ""
    status: str
    archived: bool = False
    labels: dict[str, str] = Field(default_factory=dict)
    mcp_server_ids: list[str] = Field(default_factory=list)
    last_error: ChatErrorInfo | None = None
    last_model_config_id: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class MessagesPage(WireModel):
    messages: list[ChatMessage] = Field(default_factory=list)
    queued_messages: list[QueuedMessage] = Field(default_factory=list)
    has_more: bool = False


class SendMessageResponse(WireModel):
    queued: bool = False
    message: ChatMessage | None = None
    messages: list[ChatMessage] = Field(default_factory=list)
    queued_message: QueuedMessage | None = None
    warnings: list[str] = Field(default_factory=list)


class ToolCallRequest(WireModel):
    """A pending client-tool call; ``args`` is the raw JSON text of the arguments."""

    tool_call_id: str
    tool_name: str
    args: str = "{}"


class UploadedFile(WireModel):
    id: str


class ModelConfig(WireModel):
    id: str
    provider: str | None = None
    ai_provider_id: str | None = None
    model: str = ""
    display_name: str = ""
    enabled: bool = True
    is_default: bool = False


class DynamicTool(WireModel):
    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict)


# -- stream events ------------------------------------------------------------
# Deltas are most of a stream's traffic, so they are plain slotted dataclasses
# built by a hand-written decoder (:mod:`.frames`); the other events are rarer
# and go through pydantic. They are not frozen only because a frozen dataclass
# takes three times as long to build; treat them as read-only.


@dataclass(slots=True)
class DeltaPart:
    """The preview part a delta carries (text, reasoning, tool-call or tool-result)."""

    type: str
    text: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    args_delta: str | None = None
    result_delta: str | None = None
    result_reset: bool | None = None


@dataclass(slots=True)
class MessagePartEvent:
    """A delta with its episode coordinates (absent on an era-B server).

    Flat, one object per delta (it is the hot path): a plain text delta keeps its
    text here and builds its :class:`DeltaPart` only when asked. ``message_part``
    gives the wire's nesting back: ``event.message_part.seq``, ``.part.text``.
    """

    chat_id: str | None
    role: str
    part_type: str
    text: str | None
    history_version: int | None = None
    generation_attempt: int | None = None
    seq: int | None = None
    #: The whole part, for anything but a plain text delta.
    detail: DeltaPart | None = None
    type: Literal["message_part"] = "message_part"

    @property
    def part(self) -> DeltaPart:
        return self.detail or DeltaPart(self.part_type, self.text)

    @property
    def message_part(self) -> MessagePartEvent:
        return self


class StatusPayload(WireModel):
    status: str


class ActionRequired(WireModel):
    tool_calls: list[ToolCallRequest] = Field(default_factory=list)


class RetryInfo(WireModel):
    attempt: int | None = None
    delay_ms: int | None = None
    error: str | None = None
    kind: str | None = None


class MessageEvent(WireModel):
    type: Literal["message"]
    chat_id: str | None = None
    message: ChatMessage


class StatusEvent(WireModel):
    type: Literal["status"]
    chat_id: str | None = None
    status: StatusPayload


class ErrorEvent(WireModel):
    type: Literal["error"]
    chat_id: str | None = None
    error: ChatErrorInfo = Field(default_factory=ChatErrorInfo)


class ActionRequiredEvent(WireModel):
    type: Literal["action_required"]
    chat_id: str | None = None
    action_required: ActionRequired


class QueueUpdateEvent(WireModel):
    type: Literal["queue_update"]
    chat_id: str | None = None
    queued_messages: list[QueuedMessage] | None = None


class RetryEvent(WireModel):
    type: Literal["retry"]
    chat_id: str | None = None
    retry: RetryInfo = Field(default_factory=RetryInfo)


class PreviewResetEvent(WireModel):
    type: Literal["preview_reset"]
    chat_id: str | None = None


class HistoryResetEvent(WireModel):
    type: Literal["history_reset"]
    chat_id: str | None = None


class OtherEvent(WireModel):
    """An event type this client does not know; ignored, never an error."""

    type: str
    chat_id: str | None = None


#: Known events, told apart by ``type`` (validated in Rust, which keeps decoding fast).
StreamEvent = Annotated[
    MessageEvent
    | StatusEvent
    | ErrorEvent
    | ActionRequiredEvent
    | QueueUpdateEvent
    | RetryEvent
    | PreviewResetEvent
    | HistoryResetEvent,
    Field(discriminator="type"),
]
AnyEvent = StreamEvent | MessagePartEvent | OtherEvent
#: Event types validated by pydantic; ``message_part`` has its own fast decoder.
KNOWN_EVENT_TYPES = frozenset(
    {
        "message",
        "status",
        "error",
        "action_required",
        "queue_update",
        "retry",
        "preview_reset",
        "history_reset",
    }
)

STREAM_FRAME: TypeAdapter[list[StreamEvent]] = TypeAdapter(list[StreamEvent])
STREAM_EVENT: TypeAdapter[StreamEvent] = TypeAdapter(StreamEvent)
CHATS: TypeAdapter[list[Chat]] = TypeAdapter(list[Chat])
MODEL_CONFIGS: TypeAdapter[list[ModelConfig]] = TypeAdapter(list[ModelConfig])


class WatchEvent(WireModel):
    """One ``/watch`` frame: a lifecycle event for one of the caller's chats."""

    kind: str
    chat: Chat
    tool_calls: list[ToolCallRequest] | None = None
