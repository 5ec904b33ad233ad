"""What a workflow may spend, and the error that stops it when it has.

A budget counts what the store recorded (each finished step's usage, kept on the
workflow's record in the step's own transaction), so a re-run on any machine, after
any crash, sees the same spend and stops at the same step. Coder's own usage limit
stops a workflow the same way, with Coder's figures: its refusal is never retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..errors import CoderChatError, CoderError, CoderUsageLimitError
from ..protocol.usage import UsageTotals, dollars


@dataclass(frozen=True)
class Budget:
    """Limits on a workflow's whole spend, over all its runs (``None``: no limit)."""

    #: Every token its model steps read or wrote (:attr:`UsageTotals.tokens`).
    max_tokens: int | None = None
    #: What its model steps cost, in micros, where Coder reports cost.
    max_cost_micros: int | None = None
    #: How many steps (turns) it may finish.
    max_turns: int | None = None

    def reached(self, spent: UsageTotals, finished: int) -> tuple[str, str] | None:
        """Which limit ``spent`` over ``finished`` steps reached: its setting's name, and
        the words that say so; ``None``: none."""
        if self.max_turns is not None and finished >= self.max_turns:
            return "max_turns", f"it finished {finished} turn(s), its limit is {self.max_turns}"
        if self.max_tokens is not None and spent.tokens >= self.max_tokens:
            words = f"it used {spent.tokens:,} tokens, its limit is {self.max_tokens:,}"
            return "max_tokens", words
        cost, limit = spent.total_cost_micros, self.max_cost_micros
        if limit is not None and cost is not None and cost >= limit:
            return "max_cost_micros", f"it cost {dollars(cost)}, its limit is {dollars(limit)}"
        return None

    def check(self, workflow_id: str, step: int, spent: UsageTotals) -> None:
        """Raise :class:`OverBudget` when ``spent`` over the steps before ``step`` reached
        a limit: ``step`` is not to be taken."""
        reached = self.reached(spent, step - 1)
        if reached is not None:
            limit, words = reached
            raise OverBudget(workflow_id, step, f"{words} ({limit})", limit=limit)


class OverBudget(CoderError):
    """The workflow reached a limit: of its own budget, or Coder's usage limit. It takes
    no further turn: it ends in a state of its own, its chat archived, and nothing
    relaunches it; a person resumes it (with a higher limit, or once Coder's resets)."""

    retryable = False

    def __init__(
        self,
        workflow_id: str,
        step: int,
        why: str,
        *,
        limit: str | None = None,
        by_coder: bool = False,
        resets_at: datetime | None = None,
    ) -> None:
        self.workflow_id = workflow_id
        self.step = step
        self.why = why
        #: The workflow's own setting whose limit was reached (``max_turns``, ``max_tokens``
        #: or ``max_cost_micros``); ``None`` when Coder's usage limit stopped it.
        self.limit = limit
        #: Coder's usage limit stopped it (not the workflow's own budget).
        self.by_coder = by_coder
        self.resets_at = resets_at
        super().__init__(f"workflow {workflow_id!r} stopped over budget at step {step}: {why}")

    @classmethod
    def from_coder(cls, workflow_id: str, step: int, exc: BaseException) -> OverBudget | None:
        """Coder's refusal (a 409 past the usage limit, or a turn it ended with kind
        ``usage_limit``) as the workflow's stop, with Coder's figures; ``None`` otherwise."""
        if isinstance(exc, CoderUsageLimitError):
            words = _coder_words(exc)
            return cls(workflow_id, step, words, by_coder=True, resets_at=exc.resets_at)
        if isinstance(exc, CoderChatError) and exc.kind == "usage_limit":
            said = f"; {exc.detail}" if exc.detail else ""
            words = f"Coder's usage limit is reached ({exc.message}{said})"
            return cls(workflow_id, step, words, by_coder=True)
        return None


def _coder_words(exc: CoderUsageLimitError) -> str:
    spent = "?" if exc.spent_micros is None else dollars(exc.spent_micros)
    limit = "?" if exc.limit_micros is None else dollars(exc.limit_micros)
    resets = f"; it resets at {exc.resets_at.isoformat()}" if exc.resets_at else ""
    return f"Coder's usage limit is reached (spent {spent} of {limit}{resets})"
