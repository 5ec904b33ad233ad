"""Pieces of a lab's report that every lab words alike."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean


def took(seconds: Sequence[float], digits: int = 1) -> str:
    """How long the schedules took each: the mean, the shortest and the longest."""
    each = list(seconds) or [0.0]
    low, high, middle = min(each), max(each), mean(each)
    return (
        f"each took {middle:.{digits}f}s on average (min {low:.{digits}f}s, max {high:.{digits}f}s)"
    )
