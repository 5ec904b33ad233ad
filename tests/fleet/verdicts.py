"""What a schedule's checks found: violations by invariant, counted exceptions, and figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Category = Literal[
    "unfinished workflows",
    "slow recovery",
    "double charges",
    "lost effects",
    "lost results",
    "resent finished steps",
    "live orphans",
    "fenced run reached Coder",
    "fenced run wrote",
    "superseded run's state",
    "sweep blocked",
]
CATEGORIES: tuple[Category, ...] = (
    "unfinished workflows",
    "slow recovery",
    "double charges",
    "lost effects",
    "lost results",
    "resent finished steps",
    "live orphans",
    "fenced run reached Coder",
    "fenced run wrote",
    "superseded run's state",
    "sweep blocked",
)


@dataclass(frozen=True)
class Violation:
    category: Category
    detail: str


@dataclass
class Findings:
    violations: list[Violation] = field(default_factory=list)
    #: Duplicate prompts the journal attributes to a send in flight when its host was hit.
    late: int = 0
    #: Resubmissions after an attempt that was cut short.
    cut_short: int = 0
    #: Actions on a superseded workflow's chat from its old host that no glimpse attributed.
    unattributed: list[str] = field(default_factory=list)
    #: Measured figures (recovery times beside their bounds), one line each.
    figures: list[str] = field(default_factory=list)
    #: Writes a superseded run sent at its old epoch, which its fence turned to nothing.
    fenced_out: int = 0
    #: Per silenced workflow: the fault's kind, seconds to its relaunch and to its end.
    recoveries: list[tuple[str, float, float | None]] = field(default_factory=list)

    def add(self, category: Category, detail: str) -> None:
        self.violations.append(Violation(category, detail))

    def count(self, category: Category) -> int:
        return sum(1 for v in self.violations if v.category == category)

    def of(self, category: Category) -> list[str]:
        return [v.detail for v in self.violations if v.category == category]

    def merge(self, other: Findings) -> Findings:
        self.violations += other.violations
        self.late += other.late
        self.cut_short += other.cut_short
        self.unattributed += other.unattributed
        self.figures += other.figures
        self.fenced_out += other.fenced_out
        self.recoveries += other.recoveries
        return self
