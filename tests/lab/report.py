"""Pieces of a lab's report that every lab words alike."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import mean
from typing import Any, Generic, Protocol, TypeVar

from .verdicts import Tally

Printer = Callable[[str], None]
"""Where a lab prints a line: its report's out, its progress notes."""


def took(seconds: Sequence[float], digits: int = 1) -> str:
    """How long the schedules took each: the mean, the shortest and the longest."""
    each = list(seconds) or [0.0]
    low, high, middle = min(each), max(each), mean(each)
    return (
        f"each took {middle:.{digits}f}s on average (min {low:.{digits}f}s, max {high:.{digits}f}s)"
    )


class Judged(Protocol):
    """A schedule's result: what the checks found, or the lab error that stopped it."""

    @property
    def findings(self) -> Tally[Any]: ...
    @property
    def error(self) -> str | None: ...


R = TypeVar("R", bound=Judged)


@dataclass
class Results(Generic[R]):
    """A campaign's results so far, in the order the schedules ended."""

    results: list[R] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return sum(len(r.findings.violations) for r in self.results)

    @property
    def errors(self) -> list[R]:
        """The schedules a lab error stopped before they could be judged."""
        return [r for r in self.results if r.error is not None]
