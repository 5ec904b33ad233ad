"""The turn translator: which stream events belong to this turn, and when it settles.

Pure: the session feeds it de-duplicated events and reads its verdict. A turn's
window opens at its own user message (the one the send returned, or, for a
queued prompt, the promoted message carrying the prompt's text), so nothing of
an earlier run is attributed to it. It settles:

* ``stop`` on ``waiting``/``completed``, or when another user message appears
  after the window opened (the server promoted the next queued prompt and, in
  era C, sends no terminal status for the finished turn);
* ``tool-calls`` on ``requires_action`` once the pending client calls are known;
* ``error`` on ``status: error``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .models import (
    ActionRequiredEvent,
    AnyEvent,
    ChatErrorInfo,
    ChatMessage,
    ErrorEvent,
    HistoryResetEvent,
    MessageEvent,
    StatusEvent,
    ToolCallRequest,
    Usage,
)

FinishReason = Literal["stop", "tool-calls", "error"]
_SUMMED = (
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "reasoning_tokens",
    "cache_read_tokens",
    "cache_creation_tokens",
)


@dataclass
class TurnTranslator:
    """Tracks one turn (all its segments) over the chat's event stream."""

    client_tools: frozenset[str]
    anchor_id: int | None = None
    anchor_text: str | None = None
    opened: bool = False
    status: str | None = None
    error: ChatErrorInfo | None = None
    pending: list[ToolCallRequest] = field(default_factory=list)
    finish: FinishReason | None = None
    answered: set[str] = field(default_factory=set)
    _messages: dict[int, ChatMessage] = field(default_factory=dict)
    _awaiting_action: bool = False
    #: Set once the next queued prompt was promoted: everything after it is the next turn's.
    _handed_over: bool = False

    def ingest(self, event: AnyEvent) -> None:
        if self._handed_over:
            return
        if isinstance(event, MessageEvent):
            self._message(event.message)
        elif isinstance(event, HistoryResetEvent):
            self._messages = {}  # the full history follows; the turn's part is re-collected
        elif not self.opened:
            return
        elif isinstance(event, StatusEvent):
            self._status(event.status.status)
        elif isinstance(event, ErrorEvent):
            self.error = event.error
        elif isinstance(event, ActionRequiredEvent):
            self.offer_calls(event.action_required.tool_calls)

    # -- verdicts ----------------------------------------------------------------
    @property
    def awaiting_action(self) -> bool:
        """``requires_action`` arrived but no pending calls are known yet."""
        return self._awaiting_action and self.finish is None

    def offer_calls(self, calls: list[ToolCallRequest]) -> None:
        """Pending calls from ``action_required`` (or recovered from history)."""
        fresh = [c for c in calls if c.tool_call_id not in self.answered]
        if not fresh or self.status not in ("requires_action", None):
            return
        self.pending = fresh
        self._awaiting_action = False
        self.finish = "tool-calls"

    def resume(self, submitted: list[str]) -> None:
        """Results were submitted: the same turn continues in a new segment."""
        self.answered.update(submitted)
        self.pending = []
        self.finish = None
        self.status = "running"

    # -- what the turn produced ------------------------------------------------------
    @property
    def messages(self) -> list[ChatMessage]:
        """The turn's committed messages, its own user message first, by id."""
        return [self._messages[i] for i in sorted(self._messages)]

    def usage(self) -> Usage:
        """The whole turn's usage: the sum over its assistant messages (one per model step).

        chatd reports ``input_tokens`` without cached tokens; like the reference SDK,
        the cache reads and writes are added back into the input total (and kept
        apart in their own fields too).
        """
        sums = dict.fromkeys(_SUMMED, 0)
        for message in self.messages:
            if message.role == "assistant" and message.usage is not None:
                for name in _SUMMED:
                    sums[name] += getattr(message.usage, name) or 0
        cached = sums["cache_read_tokens"] + sums["cache_creation_tokens"]
        return Usage(
            input_tokens=sums["input_tokens"] + cached,
            output_tokens=sums["output_tokens"],
            total_tokens=sums["total_tokens"] + (cached if sums["total_tokens"] else 0),
            reasoning_tokens=sums["reasoning_tokens"],
            cache_read_tokens=sums["cache_read_tokens"],
            cache_creation_tokens=sums["cache_creation_tokens"],
        )

    # -- helpers -------------------------------------------------------------------------
    def _message(self, message: ChatMessage) -> None:
        if not self.opened:
            if message.role == "user" and self._is_ours(message):
                self.opened = True
                self.anchor_id = message.id
                self._messages[message.id] = message
            return
        if message.role == "user" and message.id != self.anchor_id:
            if self.anchor_id is None or message.id > self.anchor_id:
                self.finish = self.finish or "stop"  # the next queued prompt took over
                self._handed_over = True
            return
        if self.anchor_id is not None and message.id < self.anchor_id:
            return
        self._messages[message.id] = message

    def _is_ours(self, message: ChatMessage) -> bool:
        if self.anchor_id is not None:
            return message.id == self.anchor_id
        return self.anchor_text is not None and message.text().strip() == self.anchor_text.strip()

    def _status(self, status: str) -> None:
        self.status = status
        if status in ("waiting", "completed"):
            self.finish = self.finish or "stop"
        elif status == "error":
            self.finish = "error"
        elif status == "requires_action":
            self._awaiting_action = True
        else:
            self._awaiting_action = False
