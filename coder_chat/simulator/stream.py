"""Per-subscriber stream state: what one ``/stream`` socket has been sent.

The real server keeps, per subscriber, the versions it last sent and re-reads
the chat on every change, emitting in one fixed order (wire reference 5.3):
history, ``queue_update``, ``status``, ``error``, ``action_required``, ``retry``,
``preview_reset``. :meth:`Subscriber.sync` does exactly that against the
in-memory chat, at the moment of each change, so the event order a client sees
is deterministic. Deltas are appended as they are produced, only for the
subscriber's current episode, and the whole episode is replayed from seq 1 when
a socket first connects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .state import JSON, Chat


class Subscriber:
    """One open ``/stream`` socket's view of a chat."""

    def __init__(
        self,
        chat: Chat,
        after_id: int,
        *,
        withhold_action: Callable[[], bool],
        era_b_errors: Callable[[], bool],
        era_b_deltas: Callable[[], bool],
    ) -> None:
        self.chat = chat
        self._chat_id = str(chat.id)
        self.after_id = after_id
        self.outbox: list[JSON] = []
        self.wake = asyncio.Event()
        self._withhold_action = withhold_action
        self._era_b_errors = era_b_errors
        self._era_b_deltas = era_b_deltas
        self._first = True
        self._sent_revisions: dict[int, int] = {}
        self._history_seen = -1
        self._reset_seen = chat.reset_epoch
        self._queue_seen = 0
        self._status_sent: str | None = None
        self._error_sent_at = -1
        self._action_sent_at = -1
        self._retry_seen = chat.retry_version
        self._episode: tuple[int, int] | None = None
        self._seq_sent = 0

    # -- producing events -------------------------------------------------
    def sync(self) -> None:
        """Queue the events that bring this socket up to the chat's current state."""
        chat, first = self.chat, self._first
        history_changed = chat.history_version != self._history_seen
        events = self._history_events(first)
        if chat.queue_version > self._queue_seen:
            events.append(
                self._event("queue_update", queued_messages=[q.to_wire() for q in chat.queue])
            )
            self._queue_seen = chat.queue_version
        events.extend(self._status_events())
        if chat.retry_version > self._retry_seen and chat.retry_payload is not None:
            events.append(self._event("retry", retry=chat.retry_payload))
        self._retry_seen = chat.retry_version
        attempt_changed = self._episode is not None and self._episode[1] != chat.generation_attempt
        if first or history_changed or (attempt_changed and chat.generation_attempt != 0):
            events.append(self._event("preview_reset"))
        if self._episode != chat.episode:
            self._episode, self._seq_sent = chat.episode, 0
        self._history_seen = chat.history_version
        self._first = False
        self._push(events)
        if first:
            self._push([self._delta_event(d) for d in chat.deltas])
            self._seq_sent = len(chat.deltas)

    def delta(self, part: JSON) -> None:
        """Relay one live delta if it belongs to this socket's episode."""
        if self._episode != self.chat.episode or part["seq"] != self._seq_sent + 1:
            return
        self._seq_sent = part["seq"]
        self._push([self._delta_event(part)])

    # -- helpers ----------------------------------------------------------
    def _history_events(self, first: bool) -> list[JSON]:
        chat = self.chat
        if chat.reset_epoch != self._reset_seen:
            self._reset_seen = chat.reset_epoch
            self._sent_revisions.clear()
            events = [self._event("history_reset")]
            for message in chat.visible_messages():
                events.append(self._event("message", message=message.to_wire()))
                self._sent_revisions[message.id] = message.revision
            return events
        if not first and chat.history_version == self._history_seen:
            return []
        events = []
        for message in chat.visible_messages():
            if self._sent_revisions.get(message.id) == message.revision:
                continue
            self._sent_revisions[message.id] = message.revision
            if first and message.id <= self.after_id:
                continue
            events.append(self._event("message", message=message.to_wire()))
        return events

    def _status_events(self) -> list[JSON]:
        chat, events = self.chat, []
        if chat.status != self._status_sent:
            events.append(self._event("status", status={"status": chat.status}))
            self._status_sent = chat.status
        if chat.status == "error" and self._error_sent_at != chat.history_version:
            self._error_sent_at = chat.history_version
            error = self._event("error", error=chat.last_error or _FALLBACK_ERROR)
            if self._era_b_errors() and events:
                events.insert(0, error)
            else:
                events.append(error)
        if chat.status == "requires_action" and self._action_sent_at != chat.history_version:
            self._action_sent_at = chat.history_version
            if not self._withhold_action():
                calls = [c.to_wire() for c in chat.pending_calls]
                events.append(self._event("action_required", action_required={"tool_calls": calls}))
        return events

    def _delta_event(self, part: JSON) -> JSON:
        if self._era_b_deltas():
            part = {k: v for k, v in part.items() if k not in _COORDINATES}
        return self._event("message_part", message_part=part)

    def _event(self, kind: str, **payload: object) -> JSON:
        return {"type": kind, "chat_id": self._chat_id, **payload}

    def _push(self, events: list[JSON]) -> None:
        if events:
            self.outbox.extend(events)
            self.wake.set()

    def take(self, limit: int) -> list[JSON]:
        """Remove and return up to ``limit`` queued events."""
        batch, self.outbox = self.outbox[:limit], self.outbox[limit:]
        if not self.outbox:
            self.wake.clear()
        return batch


_COORDINATES = frozenset({"history_version", "generation_attempt", "seq"})
_FALLBACK_ERROR: JSON = {
    "message": "The chat request failed unexpectedly.",
    "kind": "generic",
    "retryable": False,
}
