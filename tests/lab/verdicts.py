"""What a schedule's checks found: violations by category, and the two counted exceptions.

:class:`Tally` is the part both labs share (this single-host campaign and the fleet
lab, ``tests/fleet/verdicts.py``): violations of a lab's own categories and the two
exceptions every lab counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar, cast, get_args

Category = Literal[
    "double charges",
    "unwanted effects",
    "lost results",
    "resent finished steps",
    "live orphans",
    "token leaks",
    "people's actions",
    "miscounted usage",
]
CATEGORIES: tuple[Category, ...] = get_args(Category)

C = TypeVar("C", bound=str)
#: How a step's later attempt relates to the one before: sent again after it was cut
#: short, a late duplicate of a send in flight, or a finished step sent again.
Pair = Literal["cut short", "late", "resent"]


@dataclass(frozen=True)
class Violation(Generic[C]):
    category: C
    detail: str


@dataclass
class Tally(Generic[C]):
    violations: list[Violation[C]] = field(default_factory=list)
    #: Duplicate prompts the journal attributes to a send in flight (past its horizon,
    #: or when its host was hit).
    late: int = 0
    #: Resubmissions after an attempt cut short (an accepted interrupt) or errored.
    cut_short: int = 0

    def add(self, category: C, detail: str) -> None:
        self.violations.append(Violation(category, detail))

    def count(self, category: C) -> int:
        return sum(1 for v in self.violations if v.category == category)

    def of(self, category: C) -> list[str]:
        return [v.detail for v in self.violations if v.category == category]

    def judge_resend(self, kind: Pair, detail: str) -> None:
        """Count an attempt sent again, or report it when its step had finished."""
        if kind == "cut short":
            self.cut_short += 1
        elif kind == "late":
            self.late += 1
        else:  # every lab has this category
            self.add(cast(C, "resent finished steps"), detail)

    def merge_tally(self, other: Tally[C]) -> None:
        self.violations += other.violations
        self.late += other.late
        self.cut_short += other.cut_short


@dataclass
class Findings(Tally[Category]):
    def merge(self, other: Findings) -> None:
        self.merge_tally(other)
