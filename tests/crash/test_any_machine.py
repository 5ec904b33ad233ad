"""Crashes the ten points do not name: a rerun on another machine, a kill between two
parallel tool calls, and a workflow whose tools stop importing after a crash.

Same lab as the crash points: real child processes, SIGKILL of the whole process
group, a rerun, and every invariant checked against the peers' own records.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coder_chat.durable.markers import step_marker
from coder_chat.durable.records import WorkflowState
from tests.lab.children import CHARGE_CARD, CrashLab

from .invariants import Expect, attempts_of, check_invariants
from .story import only_chat, stored

pytestmark = pytest.mark.timeout(240)


def charge(cents: int) -> str:
    return f'/tool charge_card {{"amount_cents": {cents}}}'


@pytest.mark.parametrize("step", [1, 2, 3])
async def test_a_rerun_on_another_machine_resends_no_finished_step(
    lab: CrashLab, step: int
) -> None:
    """Killed inside step ``step``'s tool, after the charge; rerun by a worker with its
    own Prefect home and result storage (it has none of the first worker's cached
    results). Finished steps come from the store, the killed one is recovered, and
    no prompt reaches the chat twice."""
    wf = f"wf-machine-{step}"
    prompts = ["plan the refund", "check the order", "confirm it"]
    prompts[step - 1] = f"charge the card {charge(1299)}"
    params: dict[str, Any] = {
        "workflow_id": wf,
        "prompts": prompts,
        "tools": [CHARGE_CARD],
        "request_timeout_seconds": 10.0,
        "step_deadline_seconds": 60.0,
    }
    lab.payments.hold("after")
    first = await lab.start(**params)
    await lab.spawn(lab.machine("b"), **params)  # machine B imports while A works
    held = await lab.held(lab.payments.wait_held(timeout=90), first, "charge held")
    await lab.crash(first)
    lab.payments.decide(held.id, "release")
    results = await lab.finish(await lab.start(env=lab.machine("b"), **params))
    verdicts = dict.fromkeys(range(1, step), "stored") | {step: "recovered"}
    verdicts |= dict.fromkeys(range(step + 1, 4), "ran")
    await check_invariants(lab, results, Expect(wf, prompts, charges=1, verdicts=verdicts))


async def test_two_parallel_durable_calls_killed_between_them(lab: CrashLab) -> None:
    """Step 2 calls the tool twice at once; the first call is booked, the second held
    before its charge when the process dies. The rerun answers both in one request (the
    booked one from the ledger, the other re-driven under its own key), the step is
    recovered, each card charged once, and the chat archived at the end."""
    sim, wf = lab.sim, "wf-parallel"
    prompts = ["plan the refunds", f"refund both {charge(100)} {charge(200)}", "confirm"]
    params: dict[str, Any] = {"workflow_id": wf, "prompts": prompts, "tools": [CHARGE_CARD]}
    lab.payments.hold("after")
    first = await lab.start(**params, reruns=1)
    one = await lab.held(lab.payments.wait_held(timeout=90), first, "first charge held")
    lab.payments.hold("before")  # the second charge stops before it is applied
    lab.payments.decide(one.id, "release")
    two = await lab.held(lab.payments.wait_held(timeout=90), first, "second charge held")
    _, _, entries = await stored(lab, wf)
    assert sorted(e.state for e in entries) == ["committing", "done"]
    await lab.crash(first)
    lab.payments.decide(two.id, "drop")
    chat = only_chat(lab, wf)
    assert len(chat.pending_calls) == 2

    results = await lab.finish(await lab.start(**params))
    await check_invariants(
        lab,
        results,
        Expect(wf, prompts, charges=2, verdicts={1: "stored", 2: "recovered", 3: "ran"}),
    )
    answers = [r for r in sim.records.tool_results if str(r.chat_id) == str(chat.id)]
    submissions = [
        r
        for r in sim.records.requests
        if r.route == "tool_results" and str(chat.id) in r.path and r.status < 300
    ]
    assert len(answers) == 2 and len(submissions) == 1  # both calls, in one request
    assert "charged 100 cents" in results[1]["text"] and "charged 200 cents" in results[1]["text"]


async def test_tools_that_stop_importing_fail_the_workflow_and_it_still_ends(
    lab: CrashLab,
) -> None:
    """Killed after a charge was booked and before Coder heard of it; the next run's
    tool path does not import. That run fails; its failure hook, which needs no tools,
    answers the pause from the ledger, archives the chat and marks the workflow
    FAILED (the sweep never relaunches a FAILED workflow)."""
    sim, wf = lab.sim, "wf-broken-tools"
    prompts = ["plan the refund", f"charge the card {charge(1299)}"]
    sim.faults.hold("tool_results", "before")
    first = await lab.start(workflow_id=wf, prompts=prompts, tools=[CHARGE_CARD])
    held = await lab.held(sim.faults.wait_held("tool_results", timeout=90), first, "held")
    await lab.crash(first)
    sim.faults.decide(held.id, "drop")
    chat = only_chat(lab, wf)
    _, _, entries = await stored(lab, wf)
    assert [e.state for e in entries] == ["done"]

    broken = await lab.start(
        workflow_id=wf, prompts=prompts, tools=["prefect_coder.renamed_tools:charge_card"]
    )
    async with asyncio.timeout(120):
        code = await broken.proc.wait()
    assert code != 0, broken.tail()
    assert "cannot import 'prefect_coder.renamed_tools'" in broken.output()
    workflow, _, _ = await stored(lab, wf)
    assert workflow is not None and workflow.state == WorkflowState.FAILED, workflow
    assert sim.chat(chat.id).archived
    answered = [r for r in sim.records.tool_results if str(r.chat_id) == str(chat.id)]
    assert [(r.output, r.synthetic) for r in answered] == [(entries[0].output, False)]
    assert len(lab.payments.applied) == 1
    assert len(attempts_of(sim.messages(chat.id), step_marker(wf, 2))) == 1
