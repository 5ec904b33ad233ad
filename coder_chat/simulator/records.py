"""Ground truth: what the simulated server saw and did, for tests to check against."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .state import now


@dataclass(frozen=True)
class Effect:
    """One server-side tool execution (its effect happened exactly here)."""

    chat_id: uuid.UUID
    tool_call_id: str
    tool_name: str
    args: Any
    at: datetime = field(default_factory=now)


@dataclass(frozen=True)
class InterruptRecord:
    chat_id: uuid.UUID
    status_before: str
    http_status: int
    at: datetime = field(default_factory=now)


@dataclass(frozen=True)
class ArchiveRecord:
    chat_id: uuid.UUID
    archived: bool
    at: datetime = field(default_factory=now)


@dataclass(frozen=True)
class ToolResultRecord:
    chat_id: uuid.UUID
    tool_call_id: str
    tool_name: str
    output: Any
    is_error: bool
    synthetic: bool
    at: datetime = field(default_factory=now)


@dataclass(frozen=True)
class TurnRecord:
    """One model run: how long the simulated server itself spent on it (seconds)."""

    chat_id: uuid.UUID
    outcome: str
    duration: float


@dataclass(frozen=True)
class RequestRecord:
    method: str
    route: str
    path: str
    status: int
    at: datetime = field(default_factory=now)


@dataclass
class Records:
    effects: list[Effect] = field(default_factory=list)
    interrupts: list[InterruptRecord] = field(default_factory=list)
    archives: list[ArchiveRecord] = field(default_factory=list)
    tool_results: list[ToolResultRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)

    def request_counts(self) -> Counter[str]:
        """How many requests each route served (the sweep benchmark reads this)."""
        return Counter(r.route for r in self.requests)

    def clear_requests(self) -> None:
        self.requests.clear()
