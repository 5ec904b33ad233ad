"""Ages as people write them, and the sentence a prune reports."""

from __future__ import annotations

from datetime import timedelta

import pytest

from coder_chat.durable.retention import NAMED, age_words, parse_age, prune_sentence
from coder_chat.errors import CoderConfigError


@pytest.mark.parametrize(
    ("text", "age"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("2w", timedelta(days=14)),
        ("1d12h", timedelta(hours=36)),
        (" 1.5D ", timedelta(hours=36)),
        ("0s", timedelta(0)),
    ],
)
def test_ages_people_write(text: str, age: timedelta) -> None:
    assert parse_age(text) == age


@pytest.mark.parametrize("text", ["", "30", "d", "-1d", "30 days", "1y", "1d 2x", "1e3s"])
def test_what_is_not_an_age(text: str) -> None:
    with pytest.raises(CoderConfigError, match="is not an age"):
        parse_age(text)


def test_ages_in_words() -> None:
    assert age_words(timedelta(days=30)) == "30 days"
    assert age_words(timedelta(days=1)) == "1 day"
    assert age_words(timedelta(days=1.5)) == "36 hours"
    assert age_words(timedelta(minutes=90)) == "90 minutes"
    assert age_words(timedelta(seconds=61)) == "61 seconds"
    assert age_words(timedelta(0)) == "0 seconds"


def test_the_sentence() -> None:
    month = timedelta(days=30)
    assert prune_sentence(["a", "b", "c"], month) == (
        "Removed 3 workflows that ended more than 30 days ago: a, b, c."
    )
    assert prune_sentence(["a"], month, dry_run=True) == (
        "Would remove 1 workflow that ended more than 30 days ago: a."
    )
    assert prune_sentence([], month, ["failed", "cancelled"]) == (
        "Removed no failed or cancelled workflows: none ended more than 30 days ago."
    )
    every = ["finished", "failed", "cancelled", "over-budget"]
    assert prune_sentence(["a"], month, every).startswith("Removed 1 workflow that")
    assert prune_sentence(["a"], month, every[:3]).startswith(
        "Removed 1 finished or failed or cancelled workflow that"
    )
    many = [f"wf-{i}" for i in range(NAMED + 5)]
    assert prune_sentence(many, month).endswith(f"wf-{NAMED - 1} and 5 more.")
