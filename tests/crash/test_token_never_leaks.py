"""After a crash and a recovery, the session token is nowhere our side wrote to.

Searched: the SQLite store's files (database, WAL, shared memory), the whole
``PREFECT_HOME`` tree (where persisted step results live), every child's stdout
and stderr, and what the Prefect API keeps (artifacts, log lines, flow-run
parameters). Each place is first shown to hold what it should (the chat id, a
step's text, the run's log lines), so an empty search cannot pass for a clean one.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.lab.children import CHARGE_CARD, CrashLab
from tests.lab.leaks import check_no_token

from .invariants import Expect, check_invariants

pytestmark = pytest.mark.timeout(240)


async def test_the_token_never_leaks_through_a_crash_and_a_recovery(lab: CrashLab) -> None:
    wf = "wf-token-leak"
    prompts = ["plan the refund", 'charge it /tool charge_card {"amount_cents": 700}']
    params: dict[str, Any] = {"workflow_id": wf, "prompts": prompts, "tools": [CHARGE_CARD]}
    lab.payments.hold("after")  # crash point 7: the effect applied, the ledger not done
    first = await lab.start(**params, reruns=1)
    held = await lab.held(lab.payments.wait_held(timeout=90), first, "charge held")
    await lab.crash(first)
    lab.payments.decide(held.id, "release")
    second = await lab.start(**params)
    results = await lab.finish(second)
    await check_invariants(
        lab, results, Expect(wf, prompts, charges=1, verdicts={1: "stored", 2: "recovered"})
    )

    places = await check_no_token(lab)
    token = lab.sim.token
    assert token and token in lab.env()["CODER_SESSION_TOKEN"]  # the children did hold it
    chat_id = results[0]["chat_id"].encode()

    def holding(prefix: str, needle: bytes) -> list[str]:
        return [n for n, data in places.items() if n.startswith(prefix) and needle in data]

    assert holding("store ", chat_id), "the store's files were not searched"
    step_1 = b"[wf-token-leak/step-1] plan the refund"  # in step 1's persisted result
    assert holding("home ", step_1), "no persisted result was searched"
    assert holding("home ", b"charged 700 cents"), "the recovered result was not searched"
    assert holding("child-1 stderr", b"its first run") and holding("child-2 stderr", b"recovered")
    assert holding("log ", b"the earlier attempt finished"), "the API's logs were not read"
    assert holding("artifact ", b"charged 700 cents"), "the transcript artifact was not read"
    assert holding("flow run ", wf.encode()), "no flow-run parameters were read"
