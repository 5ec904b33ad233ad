"""De-duplication of a redialed stream (pure; the socket loop feeds it).

A reconnect replays committed messages past the cursor and the in-progress
episode's deltas from ``seq`` 1. Deltas are forwarded once per
(``history_version``, ``generation_attempt``, ``seq``); messages once per id and
content revision. Only forwarded messages and deltas count as forward progress,
which is what resets the redial budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .models import (
    AnyEvent,
    HistoryResetEvent,
    MessageEvent,
    MessagePartEvent,
    PreviewResetEvent,
    Usage,
)


@dataclass(frozen=True)
class Verdict:
    forward: bool
    progress: bool


_FORWARD = Verdict(True, False)
_PROGRESS = Verdict(True, True)
_DROP = Verdict(False, False)


class StreamLedger:
    """What a stream reader has forwarded, across every socket it opened."""

    def __init__(self, after_id: int | None = None) -> None:
        #: The highest committed message id seen: the ``after_id`` for a redial.
        self.cursor = after_id or 0
        self._floor = self.cursor
        #: Each assistant message's usage past ``after_id``, by id (its latest revision):
        #: what the stretch of history this stream read consumed, each message once.
        self.usage: dict[int, Usage | None] = {}
        self._revisions: dict[int, str] = {}
        self._last_seq: dict[tuple[int, int], int] = {}
        #: Deltas without episode coordinates (era B) since the last commit:
        #: a drop now could not be replayed without duplicating them.
        self.uncoordinated = False

    def accept(self, event: AnyEvent) -> Verdict:
        if isinstance(event, MessagePartEvent):
            return self._delta(event)
        if isinstance(event, MessageEvent):
            return self._message(event)
        if isinstance(event, HistoryResetEvent):
            self._revisions.clear()
            self._last_seq.clear()
            return _FORWARD
        if isinstance(event, PreviewResetEvent):
            self.uncoordinated = False
        return _FORWARD

    def _delta(self, event: MessagePartEvent) -> Verdict:
        seq, version, attempt = event.seq, event.history_version, event.generation_attempt
        if seq is None or version is None or attempt is None:
            self.uncoordinated = True
            return _PROGRESS
        episode = (version, attempt)
        if seq <= self._last_seq.get(episode, 0):
            return _DROP
        self._last_seq[episode] = seq
        return _PROGRESS

    def _message(self, event: MessageEvent) -> Verdict:
        message = event.message
        revision = json.dumps(
            [message.model_dump(mode="json", include={"content", "usage"})], sort_keys=True
        )
        if self._revisions.get(message.id) == revision:
            return _DROP
        self._revisions[message.id] = revision
        self.cursor = max(self.cursor, message.id)
        if message.role == "assistant" and message.id > self._floor:
            self.usage[message.id] = message.usage
        self.uncoordinated = False
        return _PROGRESS
