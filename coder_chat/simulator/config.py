"""Runtime configuration of the simulator.

Every timer the real server has is a field here, so tests can shrink minutes to
milliseconds. The object is mutable on purpose: tests and the admin route change
it while the simulator runs (a slower interrupt wind-down, an era-B toggle).
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class EraB:
    """Toggles that make the simulator behave like the pre-state-machine server (era B).

    Each toggle is independent, so a test can provoke exactly one old behaviour.
    """

    #: New runs pass through ``pending`` before ``running``.
    pending_status: bool = False
    #: Interrupt always answers 200 and sets ``waiting`` at once, even on an idle chat.
    interrupt_always_ok: bool = False
    #: Archiving an active chat interrupts it and archives anyway (no 409).
    archive_interrupts: bool = False
    #: Stream deltas carry no ``history_version``/``generation_attempt``/``seq``.
    deltas_without_coordinates: bool = False
    #: The ``error`` event is sent before ``status: error``.
    error_before_status: bool = False
    #: Only ``/api/experimental/chats`` exists; ``/api/v2/chats`` answers 404.
    experimental_routes_only: bool = False


@dataclass
class SimulatorConfig:
    """Everything a test or a user can tune. Times are in seconds."""

    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    organization_id: uuid.UUID = field(default_factory=uuid.uuid4)
    owner_id: uuid.UUID = field(default_factory=uuid.uuid4)
    owner_username: str = "simulated-user"
    #: Server-side deadline for a paused client tool (5 minutes in era C).
    tool_result_deadline: float = 300.0
    #: How long an interrupted run keeps winding down before it commits and settles.
    interrupt_winddown: float = 0.2
    #: Pause between two streamed deltas of the scripted model.
    delta_interval: float = 0.0
    #: Pause before each model step starts streaming.
    step_delay: float = 0.0
    #: Number of deltas a reply is streamed in when the prompt has no ``/deltas``.
    default_deltas: int = 4
    #: After a client tool timed out server-side, the model calls it once more
    #: with the same arguments under a new call id (the era-C hazard).
    recall_timed_out_tools: bool = True
    #: Maximum queued prompts per chat (429 beyond).
    max_queue: int = 20
    #: A price per token, in millionths of a dollar: when set, each assistant message's
    #: usage carries ``total_cost_micros`` (a server that reports cost); 0 reports none.
    cost_micros_per_token: int = 0
    #: The user's usage limit per period, in micros (0: none): past it, new chats and
    #: prompts are refused (409) and a running turn ends in a ``usage_limit`` error.
    #: Spend is counted from what assistant messages cost (``cost_micros_per_token``).
    usage_limit_micros: int = 0
    #: How long a usage period lasts from the simulator's start (``resets_at``), seconds.
    usage_period: float = 3600.0
    era_b: EraB = field(default_factory=EraB)

    def update(self, changes: dict[str, Any]) -> None:
        """Apply a partial update (from the admin route); unknown keys raise ``KeyError``."""
        names = {f.name for f in fields(self)}
        for key, value in changes.items():
            if key not in names or key in {"token", "organization_id", "owner_id"}:
                raise KeyError(key)
            if key == "era_b":
                era_names = {f.name for f in fields(EraB)}
                for toggle, flag in dict(value).items():
                    if toggle not in era_names:
                        raise KeyError(f"era_b.{toggle}")
                    setattr(self.era_b, toggle, bool(flag))
            else:
                setattr(self, key, type(getattr(self, key))(value))

    def public(self) -> dict[str, Any]:
        """The configuration as JSON, without the token."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "token":
                continue
            value = getattr(self, f.name)
            if isinstance(value, EraB):
                out[f.name] = {e.name: getattr(value, e.name) for e in fields(EraB)}
            elif isinstance(value, uuid.UUID):
                out[f.name] = str(value)
            else:
                out[f.name] = value
        return out

    def __repr__(self) -> str:
        return f"SimulatorConfig(organization_id={self.organization_id!s}, token=<hidden>)"
