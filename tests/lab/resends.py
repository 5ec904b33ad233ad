"""What each consecutive pair of a step's attempts was: cut short, a late send, or a resend.

The labs read the attempts from different ground truth (the simulator in process, the
fleet's Coder over HTTP) and decide differently whether an attempt was cut short; the
pairing and the budget of sends a kill left in flight are the same everywhere.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol, TypeVar

from .verdicts import Pair


class Sent(Protocol):
    """A prompt the server committed."""

    @property
    def chat_id(self) -> object: ...
    @property
    def created_at(self) -> datetime: ...


class Launched(Protocol):
    """A send a kill left in flight: it may land on ``chat_id`` any time after ``horizon``."""

    @property
    def chat_id(self) -> str: ...
    @property
    def horizon(self) -> datetime: ...


M = TypeVar("M", bound=Sent)
L = TypeVar("L", bound=Launched)


def pair_kinds(
    tries: Sequence[M], in_flight: Sequence[L], cut_short: Callable[[M, M], bool]
) -> list[Pair]:
    """Each pair's kind; every send left in flight explains at most one late attempt."""
    budget = list(in_flight)
    kinds: list[Pair] = []
    for earlier, later in itertools.pairwise(tries):
        if cut_short(earlier, later):
            kinds.append("cut short")
        elif (record := late_send(budget, earlier)) is not None:
            budget.remove(record)
            kinds.append("late")
        else:
            kinds.append("resent")
    return kinds


def late_send(budget: Sequence[L], earlier: Sent) -> L | None:
    """The send in flight that ``earlier`` may be: on its chat, past its horizon."""
    chat = str(earlier.chat_id)
    return next((r for r in budget if r.chat_id == chat and earlier.created_at >= r.horizon), None)
