"""Fault injection: the knobs tests turn to provoke every failure window.

Each knob is a small rule with a count (``None`` means every time). The HTTP
layer consults the plan at fixed points of each request (before and after its
effect is committed) and the stream writer consults it per socket. Route names
are listed in :data:`ROUTES`.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import dataclass, field
from typing import Literal

from .state import JSON, now, rfc3339

Phase = Literal["before", "after"]

#: Route names accepted by the knobs, with the request each one matches.
ROUTES: dict[str, str] = {
    "list_chats": "GET /chats",
    "create_chat": "POST /chats",
    "get_chat": "GET /chats/{chat}",
    "update_chat": "PATCH /chats/{chat}",
    "get_messages": "GET /chats/{chat}/messages",
    "send_message": "POST /chats/{chat}/messages",
    "interrupt": "POST /chats/{chat}/interrupt",
    "tool_results": "POST /chats/{chat}/tool-results",
    "delete_queued": "DELETE /chats/{chat}/queue/{id}",
    "promote_queued": "POST /chats/{chat}/queue/{id}/promote",
    "stream": "GET /chats/{chat}/stream (upgrade)",
    "watch": "GET /chats/watch (upgrade)",
    "upload_file": "POST /chats/files",
    "get_file": "GET /chats/files/{file}",
    "model_configs": "GET /chats/model-configs, GET /organizations/{org}/chats/models",
}


class UnknownRoute(ValueError):
    pass


#: Routes answered by a WebSocket upgrade: they can fail, but not be held or cut mid-request.
UPGRADES = frozenset({"stream", "watch"})


def check_route(route: str) -> str:
    if route not in ROUTES:
        raise UnknownRoute(f"unknown route {route!r}; known: {', '.join(sorted(ROUTES))}")
    return route


def check_holdable(route: str) -> str:
    if check_route(route) in UPGRADES:
        raise UnknownRoute(
            f"{route!r} is a WebSocket upgrade: use fail_next to refuse it, or drop_streams to cut it"
        )
    return route


@dataclass
class _Counted:
    remaining: int | None  # None: every time

    def take(self) -> bool:
        if self.remaining is None:
            return True
        if self.remaining <= 0:
            return False
        self.remaining -= 1
        return True

    @property
    def spent(self) -> bool:
        return self.remaining is not None and self.remaining <= 0


@dataclass
class _Failure(_Counted):
    route: str = ""
    status: int = 500


@dataclass
class _Hold(_Counted):
    route: str = ""
    phase: Phase = "after"
    chat_id: uuid.UUID | None = None
    #: "hold" waits for release/drop; "drop" cuts at once; "delay" releases after ``delay``.
    action: Literal["hold", "drop", "delay"] = "hold"
    delay: float = 0.0


@dataclass
class _StreamDrop(_Counted):
    after_events: int = 1
    chat_id: uuid.UUID | None = None


@dataclass
class _ChatScoped(_Counted):
    chat_id: uuid.UUID | None = None

    def matches(self, chat_id: uuid.UUID) -> bool:
        return self.chat_id is None or self.chat_id == chat_id


@dataclass
class HeldRequest:
    """A request stopped at a hold point, waiting for ``release`` or ``drop``."""

    id: int
    route: str
    method: str
    path: str
    phase: Phase
    chat_id: uuid.UUID | None
    held_at: str = field(default_factory=lambda: rfc3339(now()))
    outcome: Literal["release", "drop"] | None = None
    _decided: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def to_wire(self) -> JSON:
        return {
            "id": self.id,
            "route": self.route,
            "method": self.method,
            "path": self.path,
            "phase": self.phase,
            "chat_id": str(self.chat_id) if self.chat_id else None,
            "held_at": self.held_at,
            "outcome": self.outcome,
        }


class FaultPlan:
    """All active fault rules, and the requests currently held."""

    def __init__(self) -> None:
        self._failures: list[_Failure] = []
        self._holds: list[_Hold] = []
        self._drops: list[_StreamDrop] = []
        self._withhold: list[_ChatScoped] = []
        self._retries: list[_ChatScoped] = []
        self._held: dict[int, HeldRequest] = {}
        self._ids = itertools.count(1)
        self._held_changed = asyncio.Condition()

    # -- knobs ------------------------------------------------------------
    def fail_next(self, route: str, status: int, count: int = 1) -> None:
        """Answer the next ``count`` calls of ``route`` with ``status`` before any effect."""
        self._failures.append(_Failure(count, check_route(route), status))

    def hold(
        self, route: str, phase: Phase = "after", count: int = 1, chat_id: uuid.UUID | None = None
    ) -> None:
        """Stop the next matching request at ``phase`` until it is released or dropped."""
        self._holds.append(_Hold(count, check_holdable(route), phase, chat_id))

    def cut_after_commit(self, route: str, count: int = 1) -> None:
        """Commit the request's effect, then cut the connection with no response."""
        self._holds.append(_Hold(count, check_holdable(route), "after", None, "drop"))

    def cut_before_commit(self, route: str, count: int = 1) -> None:
        """Cut the connection before the request has any effect."""
        self._holds.append(_Hold(count, check_holdable(route), "before", None, "drop"))

    def delay_commit(self, route: str, seconds: float, count: int = 1) -> None:
        """Commit the request's effect only after ``seconds`` (a late-landing send)."""
        self._holds.append(_Hold(count, check_holdable(route), "before", None, "delay", seconds))

    def drop_streams(
        self, after_events: int, times: int | None = 1, chat_id: uuid.UUID | None = None
    ) -> None:
        """Cut ``/stream`` sockets after they sent ``after_events`` events (``times=None``: always)."""
        self._drops.append(_StreamDrop(times, max(0, after_events), chat_id))

    def withhold_action_required(
        self, times: int | None = 1, chat_id: uuid.UUID | None = None
    ) -> None:
        """Suppress the next ``action_required`` stream events (a reconnect re-delivers)."""
        self._withhold.append(_ChatScoped(times, chat_id))

    def retry_generation(self, times: int = 1, chat_id: uuid.UUID | None = None) -> None:
        """Make the next model generations fail once mid-stream and be retried."""
        self._retries.append(_ChatScoped(times, chat_id))

    def clear(self) -> None:
        """Remove every rule and release every held request."""
        self._failures.clear()
        self._holds.clear()
        self._drops.clear()
        self._withhold.clear()
        self._retries.clear()
        for held in list(self._held.values()):
            self.decide(held.id, "release")

    # -- consulted by the server -------------------------------------------
    def take_failure(self, route: str) -> int | None:
        for rule in self._failures:
            if rule.route == route and rule.take():
                self._prune()
                return rule.status
        return None

    def take_hold(self, route: str, phase: Phase, chat_id: uuid.UUID | None) -> _Hold | None:
        for rule in self._holds:
            if rule.route != route or rule.phase != phase:
                continue
            if rule.chat_id is not None and rule.chat_id != chat_id:
                continue
            if rule.take():
                self._prune()
                return rule
        return None

    async def wait_decision(
        self, rule: _Hold, route: str, method: str, path: str, chat_id: uuid.UUID | None
    ) -> Literal["release", "drop"]:
        """Apply a matched hold rule; return what the request must do next."""
        if rule.action == "drop":
            return "drop"
        if rule.action == "delay":
            await asyncio.sleep(rule.delay)
            return "release"
        held = HeldRequest(next(self._ids), route, method, path, rule.phase, chat_id)
        self._held[held.id] = held
        async with self._held_changed:
            self._held_changed.notify_all()
        await held._decided.wait()
        assert held.outcome is not None
        return held.outcome

    def stream_drop_after(self, chat_id: uuid.UUID) -> int | None:
        for rule in self._drops:
            if (rule.chat_id is None or rule.chat_id == chat_id) and rule.take():
                self._prune()
                return rule.after_events
        return None

    def take_withhold(self, chat_id: uuid.UUID) -> bool:
        return self._take_scoped(self._withhold, chat_id)

    def take_retry(self, chat_id: uuid.UUID) -> bool:
        return self._take_scoped(self._retries, chat_id)

    # -- held requests -------------------------------------------------------
    def held(self) -> list[HeldRequest]:
        return [h for h in self._held.values() if h.outcome is None]

    def decide(self, held_id: int, outcome: Literal["release", "drop"]) -> HeldRequest:
        held = self._held.pop(held_id)
        held.outcome = outcome
        held._decided.set()
        return held

    async def wait_held(self, route: str | None = None, timeout: float = 10.0) -> HeldRequest:
        """Wait until a request (of ``route``, if given) is held, and return it."""

        def match() -> HeldRequest | None:
            return next((h for h in self.held() if route is None or h.route == route), None)

        async with asyncio.timeout(timeout), self._held_changed:
            await self._held_changed.wait_for(lambda: match() is not None)
        found = match()
        assert found is not None
        return found

    def describe(self) -> JSON:
        def rules(
            items: list[_Failure] | list[_Hold] | list[_StreamDrop] | list[_ChatScoped],
        ) -> list[JSON]:
            return [
                {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in vars(r).items()}
                for r in items
            ]

        return {
            "failures": rules(self._failures),
            "holds": rules(self._holds),
            "stream_drops": rules(self._drops),
            "withhold_action_required": rules(self._withhold),
            "retry_generation": rules(self._retries),
            "held": [h.to_wire() for h in self.held()],
        }

    def _take_scoped(self, rules: list[_ChatScoped], chat_id: uuid.UUID) -> bool:
        for rule in rules:
            if rule.matches(chat_id) and rule.take():
                self._prune()
                return True
        return False

    def _prune(self) -> None:
        self._failures = [r for r in self._failures if not r.spent]
        self._holds = [r for r in self._holds if not r.spent]
        self._drops = [r for r in self._drops if not r.spent]
        self._withhold = [r for r in self._withhold if not r.spent]
        self._retries = [r for r in self._retries if not r.spent]
