"""What a schedule's checks found: violations by invariant, counted exceptions, and figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from tests.lab.verdicts import Tally

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
    "people's actions",
    "miscounted usage",
    "exposed secrets",
]
CATEGORIES: tuple[Category, ...] = get_args(Category)


@dataclass
class Findings(Tally[Category]):
    #: Actions on a superseded workflow's chat from its old host that no glimpse attributed.
    unattributed: list[str] = field(default_factory=list)
    #: Measured figures (recovery times beside their bounds), one line each.
    figures: list[str] = field(default_factory=list)
    #: Writes a superseded run sent at its old epoch, which its fence turned to nothing.
    fenced_out: int = 0
    #: Per silenced workflow: the fault's kind, seconds to its relaunch and to its end.
    recoveries: list[tuple[str, float, float | None]] = field(default_factory=list)

    def merge(self, other: Findings) -> Findings:
        self.merge_tally(other)
        self.unattributed += other.unattributed
        self.figures += other.figures
        self.fenced_out += other.fenced_out
        self.recoveries += other.recoveries
        return self
