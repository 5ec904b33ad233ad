"""How long ended workflows are kept, said the way people say it (``30d``, ``12h``).

Shared by ``prefect-coder workflows prune`` and the ``prune-workflows`` flow, so both read
an age the same way and report what they removed in the same words. The deleting itself
is the store's (:meth:`~coder_chat.durable.store.DurableStore.prune_workflows`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta

from ..errors import CoderConfigError
from .base import ENDED_STATES
from .records import WorkflowState

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
#: At most this many ids are named in a sentence; the rest are counted.
NAMED = 20


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` or a sum of them (``1d12h``)."""
    flat = text.strip().lower().replace(" ", "")
    parts = _PART.findall(flat)
    if not flat or "".join(number + unit for number, unit in parts) != flat:
        raise CoderConfigError(
            f"{text!r} is not an age: write a number and a unit, e.g. 30d, 12h, 90m, 45s or 2w"
        )
    return timedelta(seconds=sum(float(number) * _UNITS[unit] for number, unit in parts))


def age_words(age: timedelta) -> str:
    """``30 days``, ``12 hours``, ``90 minutes``: the largest unit that says it exactly."""
    seconds = round(age.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds and seconds % size == 0:
            return _counted(seconds // size, unit)
    return _counted(seconds, "second")


def prune_sentence(
    removed: Sequence[str],
    age: timedelta,
    states: Sequence[WorkflowState | str] = (),
    *,
    dry_run: bool = False,
) -> str:
    """``Removed 3 workflows that ended more than 30 days ago: a, b, c.``"""
    kind = _states_words(states)
    verb = "Would remove" if dry_run else "Removed"
    when = f"ended more than {age_words(age)} ago"
    if not removed:
        return f"{verb} no {kind}workflows: none {when}."
    noun = "workflow" if len(removed) == 1 else "workflows"
    that = f"{verb} {len(removed)} {kind}{noun} that {when}"
    named = ", ".join(removed[:NAMED])
    if len(removed) > NAMED:
        named += f" and {len(removed) - NAMED} more"
    return f"{that}: {named}."


def _states_words(states: Sequence[WorkflowState | str]) -> str:
    chosen = list(dict.fromkeys(str(s) for s in states))
    if not chosen or sorted(chosen) == sorted(str(s) for s in ENDED_STATES):
        return ""
    return " or ".join(chosen) + " "


def _counted(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"
