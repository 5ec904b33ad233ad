"""Log lines are read by people: a recovery reason comes with the right article."""

from __future__ import annotations

from coder_chat.durable.settle import _plain


def test_a_reason_reads_with_its_article() -> None:
    assert _plain("abort") == "an abort"
    assert _plain("hard_crash") == "a hard crash"
    assert _plain("timeout") == "a timeout"
