"""Crash point 4 with a person's changed code: a process SIGKILLed while step 2's turn runs
on Coder, then a run whose step 2 asks another prompt. It is refused before it takes
anything (the store byte-for-byte as the crash left it), and the workflow's own code then
recovers step 2 as if the refused run had never been."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.lab.children import CrashLab

from .invariants import Expect, check_invariants
from .story import PROMPTS, SHORT_STALL, crash_with_step_2_running, only_chat

pytestmark = pytest.mark.timeout(240)


def rows(db: Path, workflow_id: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return [
            *conn.execute("SELECT * FROM workflows WHERE workflow_id = ?", (workflow_id,)),
            *conn.execute(
                "SELECT * FROM steps WHERE workflow_id = ? ORDER BY step", (workflow_id,)
            ),
            *conn.execute(
                "SELECT * FROM chats WHERE workflow_id = ? ORDER BY chat_id", (workflow_id,)
            ),
        ]


async def test_a_changed_prompt_for_a_step_in_flight_is_refused_before_anything_is_taken(
    lab: CrashLab,
) -> None:
    sim, wf = lab.sim, "wf-changed-in-flight"
    params: dict[str, Any] = {"workflow_id": wf, "prompts": PROMPTS}
    await crash_with_step_2_running(lab, params, SHORT_STALL)
    sim.config.step_delay = 0.0
    before, requests = rows(lab.db, wf), len(sim.records.requests)

    changed = await lab.start(**{**params, "prompts": [PROMPTS[0], "confirm it twice"]})
    assert await changed.proc.wait() != 0
    assert "PromptChanged" in changed.output() and "step 2 of workflow" in changed.output()
    assert rows(lab.db, wf) == before  # no epoch taken, nothing written
    sent = [r for r in sim.records.requests[requests:] if r.method != "GET"]
    assert sent == [], sent  # it only read the chat's history

    results = await lab.finish(await lab.start(**params))
    await check_invariants(
        lab, results, Expect(wf, PROMPTS, verdicts={1: "stored", 2: "recovered"})
    )


async def test_a_changed_first_prompt_whose_chat_no_checkpoint_holds_is_refused_too(
    lab: CrashLab,
) -> None:
    """Crash point 2: the first step's send made the chat, and the process died before
    it checkpointed it. A run whose first step asks another prompt finds that chat by its
    labels and is refused, taking nothing (campaign 20261311/128: it took the epoch)."""
    sim, wf = lab.sim, "wf-changed-first-in-flight"
    params: dict[str, Any] = {"workflow_id": wf, "prompts": PROMPTS}
    sim.faults.hold("create_chat", "after")
    first = await lab.start(**params)
    held = await lab.held(sim.faults.wait_held("create_chat", timeout=90), first, "create held")
    await lab.crash(first)
    sim.faults.decide(held.id, "drop")
    only_chat(lab, wf)  # committed, its id never reached the process
    await lab.until(  # the dropped create is recorded once it is let go
        lambda: any(r.route == "create_chat" for r in sim.records.requests), None, "the drop"
    )
    before, requests = rows(lab.db, wf), len(sim.records.requests)

    changed = await lab.start(**{**params, "prompts": ["plan it twice", PROMPTS[1]]})
    assert await changed.proc.wait() != 0
    assert "PromptChanged" in changed.output() and "step 1 of workflow" in changed.output()
    assert rows(lab.db, wf) == before  # no epoch taken, no chat adopted
    sent = [r for r in sim.records.requests[requests:] if r.method != "GET"]
    assert sent == [], sent

    results = await lab.finish(await lab.start(**params))
    await check_invariants(lab, results, Expect(wf, PROMPTS, verdicts={1: "recovered", 2: "ran"}))
