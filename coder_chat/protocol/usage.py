"""What a run of the model consumed, summed over its assistant messages.

Coder puts a step's usage on the assistant message that step commits (wire reference
2.4), so what any stretch of a chat consumed is the sum over the assistant messages in
it, each counted once. :class:`UsageTotals` is that sum, in Coder's own fields:
``input_tokens`` without the cache, cache reads and writes apart, cost in micros (a
millionth of the currency unit) only when every message counted carried one.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ConfigDict

from .models import Usage

#: The counts that add up (``context_limit`` does not; cost is added apart).
_COUNTS = (
    "input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cache_read_tokens",
    "cache_creation_tokens",
    "total_tokens",
    "total_runtime_ms",
)


class UsageTotals(Usage):
    """The usage of some assistant messages, added up, in Coder's own fields (counts a
    message did not report add nothing), with how many ``messages`` were counted.

    ``total_cost_micros`` is set only when every counted message reported a cost: a
    partial sum would say less than was spent. A sum of nothing is all ``None``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: int = 0

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
        fields = usage.model_dump(include={*_COUNTS, "total_cost_micros"})
        return cls(messages=1, **fields)

    def __add__(self, other: UsageTotals) -> UsageTotals:
        counts = {name: _n(self, name) + _n(other, name) for name in _COUNTS}
        return UsageTotals(
            messages=self.messages + other.messages,
            **counts,
            total_cost_micros=_cost(self, other),
        )

    @property
    def tokens(self) -> int:
        """Every token the model read or wrote: input, cached or not, and output."""
        return _n(self, "input_tokens") + self.cached + _n(self, "output_tokens")

    @property
    def cached(self) -> int:
        """Prompt tokens read from, or written to, the provider's cache."""
        return _n(self, "cache_read_tokens") + _n(self, "cache_creation_tokens")

    def describe(self) -> str:
        """In plain words: ``1,234 tokens (1,100 in, 400 of them cached; 134 out), $0.0123``."""
        if not self.messages:
            return "no model steps"
        read = f"{_n(self, 'input_tokens') + self.cached:,} in"
        if self.cached:
            read += f", {self.cached:,} of them cached"
        words = f"{self.tokens:,} tokens ({read}; {_n(self, 'output_tokens'):,} out)"
        if self.total_cost_micros is not None:
            words += f", {dollars(self.total_cost_micros)}"
        return words

    def brief(self) -> str:
        """``1,234 tokens`` (``, $0.0123`` when the cost is known)."""
        cost = self.total_cost_micros
        return f"{self.tokens:,} tokens" + ("" if cost is None else f", {dollars(cost)}")


def dollars(micros: int) -> str:
    """Micros as money, to the hundredth of a cent (Coder reports no currency: $)."""
    return f"${micros / 1_000_000:,.4f}"


def _n(usage: Usage, name: str) -> int:
    value: int | None = getattr(usage, name)
    return value or 0


def _cost(a: UsageTotals, b: UsageTotals) -> int | None:
    # Zero counted messages cost nothing known, and take the other side's figure.
    if not a.messages or not b.messages:
        return b.total_cost_micros if not a.messages else a.total_cost_micros
    if a.total_cost_micros is None or b.total_cost_micros is None:
        return None
    return a.total_cost_micros + b.total_cost_micros
