"""Each crash point of DESIGN.md: SIGKILL a real ``durable_chat`` process there, rerun, check.

Every point is reached through a peer, never by patching our code: the
simulator's hold knob (a request held before or after its effect commits), its
``step_delay`` timer (a run that is still going when the process dies), its
fault plan (a stream that never delivers the finish), or the payments fake's
own hold (a charge held before or after it is applied). The child running the
workflow is killed with SIGKILL while the request is held; only then is the held
request dropped or released. A fresh child reruns the same workflow id, and
:func:`check_invariants` checks every invariant against the peers' records.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest

from coder_chat.durable.markers import step_marker
from coder_chat.durable.records import LedgerEntry
from coder_chat.simulator.state import Chat
from prefect_coder.payments import Outcome, Phase
from tests.lab.children import CHARGE_CARD, Child, CrashLab

from .invariants import Expect, attempts_of, check_invariants
from .story import (
    PROMPTS,
    SHORT_STALL,
    STALL,
    crash_with_step_2_running,
    labelled,
    only_chat,
    stored,
    tool_prompts,
)

pytestmark = pytest.mark.timeout(240)


def accepted_interrupts(lab: CrashLab, chat: Chat) -> int:
    return sum(
        1 for i in lab.sim.records.interrupts if i.chat_id == chat.id and i.http_status == 200
    )


async def rerun_stalled(lab: CrashLab, chat: Chat, **params: Any) -> list[dict[str, Any]]:
    """Rerun while the crashed attempt's run is stalled; un-stall the model once recovery
    has interrupted it, so the resubmission answers at once."""
    before = accepted_interrupts(lab, chat)
    child = await lab.start(**params)
    await lab.until(lambda: accepted_interrupts(lab, chat) > before, child, "recovery's interrupt")
    lab.sim.config.step_delay = 0.0
    return await lab.finish(child)


# -- 1 to 3: the first chat ---------------------------------------------------------------------


async def crash_while_creating(
    lab: CrashLab, phase: Literal["before", "after"], **start: Any
) -> None:
    """Start a run and kill it while Coder holds the request that makes its first chat
    (``phase``: before or after the chat is made); the held answer never arrives."""
    lab.sim.faults.hold("create_chat", phase)
    first = await lab.start(**start)
    held = await lab.held(lab.sim.faults.wait_held("create_chat", timeout=90), first, "create held")
    await lab.crash(first)
    lab.sim.faults.decide(held.id, "drop")


async def test_point_1_before_the_first_chat_exists(lab: CrashLab) -> None:
    sim, wf = lab.sim, "wf-crash-1"
    await crash_while_creating(lab, "before", workflow_id=wf, prompts=PROMPTS, reruns=1)
    assert sim.chats() == []  # the create request never had an effect
    results = await lab.finish(await lab.start(workflow_id=wf, prompts=PROMPTS))
    await check_invariants(lab, results, Expect(wf, PROMPTS, verdicts={1: "ran", 2: "ran"}))


async def test_point_2_create_committed_response_lost(lab: CrashLab) -> None:
    wf = "wf-crash-2"
    params: dict[str, Any] = {"workflow_id": wf, "prompts": PROMPTS, "archive_at_end": False}
    await crash_while_creating(lab, "after", **params, reruns=1)
    orphan = only_chat(lab, wf)  # committed, its id never reached the process
    workflow, _, _ = await stored(lab, wf)
    assert workflow is not None and workflow.chat_id is None
    results = await lab.finish(await lab.start(**params))
    # The orphan was adopted by its labels and its finished first turn recovered; it is
    # the one chat left unarchived, and the checkpoint owns it.
    assert results[0]["chat_id"] == str(orphan.id)
    await check_invariants(
        lab,
        results,
        Expect(wf, PROMPTS, verdicts={1: "recovered", 2: "ran"}, archived=False),
    )


async def test_point_3_chat_created_checkpoint_not_written(lab: CrashLab) -> None:
    sim, wf = lab.sim, "wf-crash-3"
    params: dict[str, Any] = {"workflow_id": wf, "prompts": PROMPTS, "archive_at_end": False}
    sim.config.step_delay = SHORT_STALL  # the first turn is still running when the process dies
    first = await lab.start(**params, reruns=1)
    await lab.until(
        lambda: len(labelled(lab, wf)) == 1 and labelled(lab, wf)[0].status == "running",
        first,
        "the first chat running",
    )
    await lab.crash(first)
    chat = only_chat(lab, wf)
    workflow, _, _ = await stored(lab, wf)
    assert workflow is not None and workflow.chat_id is None  # no checkpoint yet
    sim.config.step_delay = 0.0  # later turns answer at once; the running one keeps its pause
    results = await lab.finish(await lab.start(**params))
    # The orphan was adopted and its live run left to finish: recovered, never resent.
    assert results[0]["chat_id"] == str(chat.id)
    assert accepted_interrupts(lab, chat) == 0
    await check_invariants(
        lab,
        results,
        Expect(wf, PROMPTS, verdicts={1: "recovered", 2: "ran"}, archived=False),
    )


# -- 4 and 5: a later step ------------------------------------------------------------------------


@pytest.mark.parametrize("overrun", [False, True], ids=["finishes", "overruns-its-budget"])
async def test_point_4_prompt_sent_turn_still_running(lab: CrashLab, overrun: bool) -> None:
    """A crash while step 2's turn runs on the server. The rerun lets that run finish
    and recovers it; only a run still going after the step's own deadline is cut short
    (an interrupt the server accepts) and the step sent again."""
    sim, wf = lab.sim, f"wf-crash-4-{overrun}"
    params: dict[str, Any] = {"workflow_id": wf, "prompts": PROMPTS}
    if overrun:
        params["step_deadline_seconds"] = 4.0
    chat = await crash_with_step_2_running(lab, params, STALL if overrun else SHORT_STALL, reruns=1)
    marker = step_marker(wf, 2)
    workflow, record, _ = await stored(lab, wf)
    assert workflow is not None and workflow.chat_id == str(chat.id)
    assert record is not None and record.journal is not None
    assert (record.journal.state, record.journal.marker) == ("submitting", marker)
    if overrun:
        results = await rerun_stalled(lab, chat, **params)
        expect = Expect(wf, PROMPTS, attempts={2: 2}, verdicts={1: "stored", 2: "resubmitted"})
    else:
        sim.config.step_delay = 0.0
        results = await lab.finish(await lab.start(**params))
        assert accepted_interrupts(lab, chat) == 0
        expect = Expect(wf, PROMPTS, verdicts={1: "stored", 2: "recovered"})
    await check_invariants(lab, results, expect)


async def test_point_5_turn_finished_result_not_recorded(lab: CrashLab) -> None:
    sim, wf = lab.sim, "wf-crash-5"
    sim.faults.hold("send_message", "before")
    first = await lab.start(workflow_id=wf, prompts=PROMPTS, reruns=1)
    held = await lab.held(sim.faults.wait_held("send_message", timeout=90), first, "send held")
    sim.faults.fail_next("stream", 503, count=1000)  # the process never sees the finish
    sim.faults.decide(held.id, "release")
    chat = only_chat(lab, wf)
    marker = step_marker(wf, 2)

    def step_2_finished() -> bool:
        messages = sim.messages(chat.id)
        tries = attempts_of(messages, marker)
        return (
            chat.status == "waiting"
            and len(tries) == 1
            and any(m.role == "assistant" and m.id > tries[0].id for m in messages)
        )

    await lab.until(step_2_finished, first, "step 2 finished on the server")
    await lab.crash(first)
    sim.faults.clear()
    results = await lab.finish(await lab.start(workflow_id=wf, prompts=PROMPTS))
    await check_invariants(
        lab, results, Expect(wf, PROMPTS, verdicts={1: "stored", 2: "recovered"})
    )


# -- 6 to 8: a durable client tool, in a later step and in the first -----------------------------

TOOL_STEPS = [pytest.param(2, id="later-step"), pytest.param(1, id="first-step")]


async def crash_in_tool(lab: CrashLab, wf: str, step: int, hold: Any) -> list[LedgerEntry]:
    """Start the workflow, let ``hold`` stop it inside the tool step, kill it; return the ledger."""
    first = await lab.start(
        workflow_id=wf, prompts=tool_prompts(step), tools=[CHARGE_CARD], reruns=1
    )
    await hold(first)
    workflow, _, entries = await stored(lab, wf)
    assert workflow is not None
    # In the first step nothing has checkpointed the chat: the rerun must adopt it by labels.
    assert (workflow.chat_id is None) == (step == 1)
    assert only_chat(lab, wf).status == "requires_action"
    return entries


async def finish_tool_workflow(lab: CrashLab, wf: str, step: int) -> list[dict[str, Any]]:
    results = await lab.finish(
        await lab.start(workflow_id=wf, prompts=tool_prompts(step), tools=[CHARGE_CARD])
    )
    verdicts = {1: "stored", 2: "ran", step: "recovered"}
    await check_invariants(
        lab, results, Expect(wf, tool_prompts(step), charges=1, verdicts=verdicts)
    )
    assert "charged 1299 cents" in results[step - 1]["text"]
    return results


async def crash_while_charging(
    lab: CrashLab, wf: str, step: int, phase: Phase, *, then: Outcome
) -> list[LedgerEntry]:
    """Kill the run while the payments service holds its charge (``phase``: before or
    after applying it), then let the held charge ``then`` drop or go through; returns the
    ledger's entries as the crash left them."""
    lab.payments.hold(phase)

    async def hold(child: Child) -> None:
        held = await lab.held(lab.payments.wait_held(timeout=90), child, "charge held")
        await lab.crash(child)
        lab.payments.decide(held.id, then)

    return await crash_in_tool(lab, wf, step, hold)


@pytest.mark.parametrize("step", TOOL_STEPS)
async def test_point_6_ledger_committing_effect_not_applied(lab: CrashLab, step: int) -> None:
    wf = f"wf-crash-6-{step}"
    entries = await crash_while_charging(lab, wf, step, "before", then="drop")
    assert [e.state for e in entries] == ["committing"]
    assert lab.payments.applied == {}
    await finish_tool_workflow(lab, wf, step)
    # Re-driven under the same key: applied once, by the recovery.
    assert lab.payments.requests == {entries[0].idempotency_key: 1}


@pytest.mark.parametrize("step", TOOL_STEPS)
async def test_point_7_effect_applied_ledger_not_done(lab: CrashLab, step: int) -> None:
    wf = f"wf-crash-7-{step}"
    entries = await crash_while_charging(lab, wf, step, "after", then="release")
    assert [e.state for e in entries] == ["committing"]
    key = entries[0].idempotency_key
    assert lab.payments.applied == {key: 1}
    await finish_tool_workflow(lab, wf, step)
    # The re-drive reached the payments service with the same key and applied nothing.
    assert lab.payments.requests == {key: 2} and lab.payments.applied == {key: 1}


@pytest.mark.parametrize("step", TOOL_STEPS)
async def test_point_8_ledger_done_results_not_submitted(lab: CrashLab, step: int) -> None:
    sim, wf = lab.sim, f"wf-crash-8-{step}"
    sim.faults.hold("tool_results", "before")

    async def hold(child: Child) -> None:
        held = await lab.held(sim.faults.wait_held("tool_results", timeout=90), child, "held")
        await lab.crash(child)
        sim.faults.decide(held.id, "drop")

    entries = await crash_in_tool(lab, wf, step, hold)
    assert [e.state for e in entries] == ["done"]
    await finish_tool_workflow(lab, wf, step)
    # Answered from the ledger: the effect never ran again.
    assert lab.payments.requests == {entries[0].idempotency_key: 1}


# -- 9: a crash during recovery itself -------------------------------------------------------------


@pytest.mark.parametrize("phase", ["before", "after"])
async def test_point_9_crash_during_recovery(lab: CrashLab, phase: str) -> None:
    """Point 8, then the recovery dies at its own ``tool_results`` submission, after its
    journal write-ahead; a third run finishes. Held ``before``, the submission never
    lands (the pause is reconciled again); held ``after``, it landed and revived the run,
    which the third run must not interrupt (it honours the journaled ``resumed``)."""
    sim, wf = lab.sim, f"wf-crash-9-{phase}"
    prompts = tool_prompts(2)
    sim.faults.hold("tool_results", "before")
    first = await lab.start(workflow_id=wf, prompts=prompts, tools=[CHARGE_CARD], reruns=2)
    held = await lab.held(sim.faults.wait_held("tool_results", timeout=90), first, "held")
    await lab.crash(first)
    sim.faults.decide(held.id, "drop")
    chat = only_chat(lab, wf)
    assert chat.status == "requires_action"

    sim.faults.hold("tool_results", phase)  # type: ignore[arg-type]
    second = await lab.start(workflow_id=wf, prompts=prompts, tools=[CHARGE_CARD])
    held = await lab.held(sim.faults.wait_held("tool_results", timeout=90), second, "held")
    # Recovery journaled its verdict before submitting anything.
    _, record, entries = await stored(lab, wf)
    assert record is not None and record.journal is not None
    assert (record.journal.state, record.journal.marker) == ("resumed", step_marker(wf, 2))
    assert [e.state for e in entries] == ["done"]
    await lab.crash(second)
    sim.faults.decide(held.id, "drop" if phase == "before" else "release")
    if phase == "after":
        await sim.wait_for_status(chat.id, "waiting")
    interrupts = accepted_interrupts(lab, chat)

    third = await lab.start(workflow_id=wf, prompts=prompts, tools=[CHARGE_CARD])
    results = await lab.finish(third)
    await check_invariants(
        lab, results, Expect(wf, prompts, charges=1, verdicts={1: "stored", 2: "recovered"})
    )
    assert lab.payments.requests == {entries[0].idempotency_key: 1}
    if phase == "after":
        assert "the journal says the earlier attempt was resumed" in third.output()
        assert accepted_interrupts(lab, chat) == interrupts  # the revived run was left alone
    else:
        assert "the chat was waiting on client tools; answered 1" in third.output()


async def test_point_9_crash_during_recovery_of_an_adopted_first_step(lab: CrashLab) -> None:
    """Point 2, then the rerun adopts the orphan (checkpointing it) and dies while it
    reads history for the result: no journal entry exists for a first step (its send
    was the create). The third run still finds the finished first attempt in history
    and recovers it instead of resubmitting it."""
    sim, wf = lab.sim, "wf-crash-9-adopted"
    await crash_while_creating(lab, "after", workflow_id=wf, prompts=PROMPTS, reruns=2)
    chat = only_chat(lab, wf)
    await sim.wait_for_status(chat.id, "waiting")  # the orphan's first turn finished

    sim.faults.hold("get_messages", "before", chat_id=chat.id)
    second = await lab.start(workflow_id=wf, prompts=PROMPTS)
    for _ in range(5):
        held = await lab.held(sim.faults.wait_held("get_messages", timeout=90), second, "held")
        workflow, record, _ = await stored(lab, wf)
        if workflow is not None and workflow.chat_id is not None:
            break
        # Its first read checks, before it takes anything, that the chat was sent this
        # prompt (a changed one is refused): let it through, and hold the next.
        sim.faults.hold("get_messages", "before", chat_id=chat.id)
        sim.faults.decide(held.id, "release")
    assert workflow is not None and workflow.chat_id == str(chat.id)  # adopted
    assert record is None or record.journal is None
    await lab.crash(second)
    sim.faults.decide(held.id, "drop")

    results = await lab.finish(await lab.start(workflow_id=wf, prompts=PROMPTS))
    await check_invariants(lab, results, Expect(wf, PROMPTS, verdicts={1: "recovered", 2: "ran"}))


async def test_point_9_crash_while_recovery_runs_a_call_that_never_started(
    lab: CrashLab,
) -> None:
    """The crash hit a tool step before its ledger write (the tool never ran). Recovery
    journals ``resumed`` and runs the call itself, under its own key, and dies with the
    charge applied but not recorded. The third run re-drives the committing entry with
    the same key: the card is charged once and the step is recovered, never resent."""
    sim, wf = lab.sim, "wf-crash-9-unstarted"
    prompts = tool_prompts(2)
    sim.faults.withhold_action_required()  # the process learns of the pause only via REST
    first = await lab.start(workflow_id=wf, prompts=prompts, tools=[CHARGE_CARD], reruns=2)
    await lab.until(
        lambda: len(labelled(lab, wf)) == 1 and labelled(lab, wf)[0].status == "requires_action",
        first,
        "the tool pause",
    )
    chat = only_chat(lab, wf)
    sim.faults.hold("get_messages", "before", chat_id=chat.id)  # its lost-event recovery
    held = await lab.held(sim.faults.wait_held("get_messages", timeout=90), first, "held")
    await lab.crash(first)
    sim.faults.decide(held.id, "drop")
    _, _, entries = await stored(lab, wf)
    assert entries == []  # the tool never started

    lab.payments.hold("after")
    second = await lab.start(workflow_id=wf, prompts=prompts, tools=[CHARGE_CARD])
    charge = await lab.held(lab.payments.wait_held(timeout=90), second, "charge held")
    _, record, entries = await stored(lab, wf)
    assert record is not None and record.journal is not None
    assert (record.journal.state, record.journal.marker) == ("resumed", step_marker(wf, 2))
    assert [e.state for e in entries] == ["committing"]
    await lab.crash(second)
    lab.payments.decide(charge.id, "release")

    third = await lab.start(workflow_id=wf, prompts=prompts, tools=[CHARGE_CARD])
    results = await lab.finish(third)
    await check_invariants(
        lab, results, Expect(wf, prompts, charges=1, verdicts={1: "stored", 2: "recovered"})
    )
    key = entries[0].idempotency_key
    assert lab.payments.applied == {key: 1} and lab.payments.requests == {key: 2}


async def test_tool_deadline_passed_before_recovery(lab: CrashLab) -> None:
    """Point 7 recovered late: the server timed the paused tool out meanwhile and the
    model called it again, same arguments, new call id. Recovery answers the new call
    from the ledger (re-driving the old key); the effect is never applied twice."""
    sim, wf = lab.sim, "wf-crash-deadline"
    lab.payments.hold("after")

    async def hold(child: Child) -> None:
        held = await lab.held(lab.payments.wait_held(timeout=90), child, "charge held")
        await lab.crash(child)
        lab.payments.decide(held.id, "release")

    entries = await crash_in_tool(lab, wf, 2, hold)
    chat = only_chat(lab, wf)
    first_call = chat.pending_calls[0].tool_call_id
    sim.time_out_tools(chat.id)
    await lab.until(
        lambda: (
            chat.status == "requires_action"
            and [c.tool_call_id for c in chat.pending_calls] not in ([], [first_call])
        ),
        None,
        "the model calling the tool again",
    )
    await finish_tool_workflow(lab, wf, 2)
    key = entries[0].idempotency_key
    assert lab.payments.applied == {key: 1} and lab.payments.requests == {key: 2}
    _, _, ledger = await stored(lab, wf)
    assert len(ledger) == 2 and len({e.output for e in ledger}) == 1, ledger


# -- 10: a send in flight that lands after the process died -----------------------------------------


async def test_point_10_send_lands_after_the_process_died(lab: CrashLab) -> None:
    sim, wf = lab.sim, "wf-crash-10"
    params: dict[str, Any] = {"workflow_id": wf, "prompts": PROMPTS, "request_timeout_seconds": 4.0}
    sim.faults.hold("send_message", "before")
    first = await lab.start(**params, reruns=1)
    held = await lab.held(sim.faults.wait_held("send_message", timeout=90), first, "send held")
    await lab.crash(first)
    chat = only_chat(lab, wf)
    marker = step_marker(wf, 2)
    _, record, _ = await stored(lab, wf)
    assert record is not None and record.journal is not None
    journaled = record.journal
    assert (journaled.state, journaled.marker, journaled.attempt) == ("submitting", marker, 0)
    assert journaled.horizon is not None

    second = await lab.start(**params)
    await lab.until(
        lambda: len(attempts_of(sim.messages(chat.id), marker)) == 1, second, "the resubmission"
    )
    sim.faults.decide(held.id, "release")  # the crashed process's send lands only now
    results = await lab.finish(second)
    await check_invariants(
        lab,
        results,
        Expect(wf, PROMPTS, attempts={2: 2}, late_step=2, verdicts={1: "stored", 2: "resubmitted"}),
    )
    resubmitted, late = attempts_of(sim.messages(chat.id), marker)
    # The one honest exception: a duplicate marker in history, the late send after the
    # resubmission, and the resubmission no earlier than the crashed send's horizon.
    assert resubmitted.created_at >= journaled.horizon, (resubmitted.created_at, journaled)
    assert late.id > resubmitted.id
