"""What a run of the model consumed, summed over its assistant messages.

Coder puts a step's usage on the assistant message that step commits (wire reference
2.4), so what any stretch of a chat consumed is the sum over the assistant messages in
it, each counted once. :class:`UsageTotals` is that sum, kept as Coder reports it:
``input_tokens`` without the cache, cache reads and writes apart, cost in micros (a
millionth of the currency unit) only when every message counted carried one.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from .models import Usage

_TOKENS = (
    "input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cache_read_tokens",
    "cache_creation_tokens",
    "total_tokens",
)


class UsageTotals(BaseModel):
    """The usage of some assistant messages, added up (zero for none)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: How many assistant messages (model steps) were counted.
    messages: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0
    #: chatd's own total, which leaves the cache out as its input does.
    total_tokens: int = 0
    #: Set only when every counted message reported a cost: a partial sum would say less
    #: than was spent.
    cost_micros: int | None = None
    runtime_ms: int = 0

    @classmethod
    def of(cls, usages: Iterable[Usage | None]) -> UsageTotals:
        """The sum of ``usages``, one per assistant message (``None``: it reported none)."""
        total = cls()
        for usage in usages:
            total = total + cls.one(usage)
        return total

    @classmethod
    def one(cls, usage: Usage | None) -> UsageTotals:
        """One assistant message's usage (``None``: counted, with nothing reported)."""
        if usage is None:
            return cls(messages=1)
        counts = {name: getattr(usage, name) or 0 for name in _TOKENS}
        return cls(
            messages=1,
            **counts,
            cost_micros=usage.total_cost_micros,
            runtime_ms=usage.total_runtime_ms or 0,
        )

    def __add__(self, other: UsageTotals) -> UsageTotals:
        counts = {name: getattr(self, name) + getattr(other, name) for name in _TOKENS}
        return UsageTotals(
            messages=self.messages + other.messages,
            **counts,
            cost_micros=_cost(self, other),
            runtime_ms=self.runtime_ms + other.runtime_ms,
        )

    @property
    def tokens(self) -> int:
        """Every token the model read or wrote: input, cached or not, and output."""
        cached = self.cache_read_tokens + self.cache_creation_tokens
        return self.input_tokens + cached + self.output_tokens

    def describe(self) -> str:
        """In plain words: ``1,234 tokens (1,100 in, 400 of them cached; 134 out), $0.0123``."""
        if not self.messages:
            return "no model steps"
        cached = self.cache_read_tokens + self.cache_creation_tokens
        read = f"{self.input_tokens + cached:,} in"
        if cached:
            read += f", {cached:,} of them cached"
        words = f"{self.tokens:,} tokens ({read}; {self.output_tokens:,} out)"
        if self.cost_micros is not None:
            words += f", {dollars(self.cost_micros)}"
        return words

    def brief(self) -> str:
        """``1,234 tokens`` (``, $0.0123`` when the cost is known)."""
        cost = "" if self.cost_micros is None else f", {dollars(self.cost_micros)}"
        return f"{self.tokens:,} tokens{cost}"


def dollars(micros: int) -> str:
    """Micros as money, to the hundredth of a cent (Coder reports no currency: $)."""
    return f"${micros / 1_000_000:,.4f}"


def _cost(a: UsageTotals, b: UsageTotals) -> int | None:
    # Zero counted messages cost nothing known, and take the other side's figure.
    if not a.messages or not b.messages:
        return b.cost_micros if not a.messages else a.cost_micros
    if a.cost_micros is None or b.cost_micros is None:
        return None
    return a.cost_micros + b.cost_micros
