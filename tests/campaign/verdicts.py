"""What a schedule's checks found: violations by category, and the two counted exceptions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Category = Literal[
    "double charges",
    "unwanted effects",
    "lost results",
    "resent finished steps",
    "live orphans",
    "token leaks",
]
CATEGORIES: tuple[Category, ...] = (
    "double charges",
    "unwanted effects",
    "lost results",
    "resent finished steps",
    "live orphans",
    "token leaks",
)


@dataclass(frozen=True)
class Violation:
    category: Category
    detail: str


@dataclass
class Findings:
    violations: list[Violation] = field(default_factory=list)
    #: Duplicate prompts the journal attributes to a send in flight past its horizon.
    late: int = 0
    #: Resubmissions after an attempt cut short (an accepted interrupt) or errored.
    cut_short: int = 0

    def add(self, category: Category, detail: str) -> None:
        self.violations.append(Violation(category, detail))

    def count(self, category: Category) -> int:
        return sum(1 for v in self.violations if v.category == category)

    def merge(self, other: Findings) -> None:
        self.violations += other.violations
        self.late += other.late
        self.cut_short += other.cut_short
