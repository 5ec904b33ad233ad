"""Each check of the campaign can fail: every violation category fires on evidence
made for it with real peers (the simulator, the payments fake, the Prefect API),
and stays quiet on its honest counterpart."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import timedelta

import httpx
import pytest
from prefect import flow, get_run_logger
from prefect.artifacts import acreate_markdown_artifact

from coder_chat.durable.markers import chat_labels, step_marker
from coder_chat.durable.records import utcnow
from coder_chat.simulator import Simulator
from prefect_coder.payments import serve_payments
from tests.lab.children import Returned
from tests.lab.steps import Kill, Step, WorkflowPlan
from tests.lab.truth import StatusLog
from tests.simulator.wire import V2, Wire, declare

from .charges import check_charges
from .checks import check_leaks, check_orphans
from .drive import RunRecord, WorkflowOutcome
from .kills import InFlight
from .leaks import TokenIndex, api_leaks
from .own_flows import check_archived_at_end, check_returned, check_unplanned
from .resends import check_resends
from .results import check_results

WF = "wf-checks"
PLAN = WorkflowPlan(WF, (Step("plain", "plan it"),), (Kill("moment"),))


def prompt(text: str = "plan it") -> str:
    return f"{step_marker(WF, 1)} {text}"


async def labelled_chat(wire: Wire, text: str, **extra: object) -> str:
    chat = await wire.create(text, labels=chat_labels(WF, 1, "local", "checks-store"), **extra)
    return str(chat["id"])


async def sent_twice(sim: Simulator, wire: Wire) -> str:
    """The step's prompt sent again after its first attempt finished."""
    chat = await labelled_chat(wire, prompt())
    await sim.wait_for_status(chat, "waiting")
    assert (await wire.send(chat, prompt())).status_code in (200, 201, 202)
    await asyncio.sleep(0.05)
    await sim.wait_for_status(chat, "waiting")
    return chat


# -- resent finished steps, and the two counted exceptions -------------------------------------


async def test_a_step_sent_again_after_it_finished_is_a_violation(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        await sent_twice(sim, wire)
    findings = check_resends(sim, WorkflowOutcome(PLAN), StatusLog())
    assert findings.count("resent finished steps") == 1
    assert (findings.late, findings.cut_short) == (0, 0)


async def test_a_resubmission_after_an_accepted_interrupt_is_counted_not_violated(
    sim: Simulator,
) -> None:
    async with Wire(sim) as wire:
        chat = await labelled_chat(wire, prompt("think /sleep 30"))
        await sim.wait_for_status(chat, "running")
        assert (await wire.http.post(f"{V2}/{chat}/interrupt")).status_code == 200
        await sim.wait_for_status(chat, "waiting")
        await wire.send(chat, prompt("think"))
        await sim.wait_for_status(chat, "waiting")
    findings = check_resends(sim, WorkflowOutcome(PLAN), StatusLog())
    assert (findings.violations, findings.cut_short) == ([], 1)


async def test_a_duplicate_the_journal_puts_past_its_horizon_is_a_late_send(
    sim: Simulator,
) -> None:
    async with Wire(sim) as wire:
        chat = await sent_twice(sim, wire)
    horizon = sim.messages(chat)[0].created_at - timedelta(seconds=1)
    killed = RunRecord(1, Kill("moment"), killed=True)
    killed.in_flight = InFlight(chat, step_marker(WF, 1), horizon)
    findings = check_resends(sim, WorkflowOutcome(PLAN, [killed]), StatusLog())
    assert (findings.violations, findings.late) == ([], 1)
    # A send whose horizon had not passed when the first attempt landed explains nothing.
    killed.in_flight = InFlight(chat, step_marker(WF, 1), horizon + timedelta(seconds=60))
    assert check_resends(sim, WorkflowOutcome(PLAN, [killed]), StatusLog()).violations


# -- lost results ---------------------------------------------------------------------------------


async def test_a_workflow_no_run_completed_lost_every_step(sim: Simulator) -> None:
    async with serve_payments() as (_, payments):
        findings = check_results(sim, payments, WorkflowOutcome(PLAN), StatusLog())
    assert findings.count("lost results") == 1


async def test_a_result_must_be_the_committed_answer(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat = await labelled_chat(wire, prompt())
        await sim.wait_for_status(chat, "waiting")
    committed = f'You said: "{prompt()}"'
    async with serve_payments() as (_, payments):
        for text, lost in ((committed, 0), ("something else", 1), ("", 2)):
            result = {"step": 1, "text": text, "chat_id": chat}
            outcome = WorkflowOutcome(PLAN, results=[result])
            assert (
                check_results(sim, payments, outcome, StatusLog()).count("lost results") == lost
            ), text


# -- double charges -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Called:
    """A step's chat whose agent called a tool, and the call."""

    chat: str
    call: str
    #: The idempotency key the tool books the call's effect under.
    key: str


async def tool_called(sim: Simulator, wire: Wire, tool: str, args: dict[str, object]) -> Called:
    text = prompt(f"/tool {tool} {json.dumps(args)}")
    chat = await labelled_chat(wire, text, **declare(tool))
    call = (await sim.wait_for_status(chat, "requires_action")).pending_calls[0].tool_call_id
    return Called(chat, call, f"{sim.organization_id}/{chat}/{call}")


async def test_one_logical_call_booked_under_two_keys_is_a_double_charge(sim: Simulator) -> None:
    tenant = str(sim.organization_id)
    async with Wire(sim) as wire, serve_payments() as (url, payments):
        called = await tool_called(sim, wire, "charge_card", {"amount_cents": 500})
        chat, first = called.chat, called.call
        sim.time_out_tools(chat)  # the server re-calls: same step, same arguments, new id
        for _ in range(500):
            calls = [c.tool_call_id for c in sim.chat(chat).pending_calls]
            if calls and calls != [first]:
                break
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=url) as http:
            for call in (first, calls[0]):
                key = f"{tenant}/{chat}/{call}"
                body = {"amount_cents": 500}
                await http.post("/charges", json=body, headers={"Idempotency-Key": key})
                assert check_charges(sim, payments).count("double charges") == (call != first)


async def test_an_effect_no_step_asked_for_is_unwanted(sim: Simulator) -> None:
    """A refund after the person declined: the plan's steps ask for no such amount."""
    body = {"order_id": "7", "amount_cents": 500}
    async with Wire(sim) as wire, serve_payments() as (url, payments):
        called = await tool_called(sim, wire, "issue_refund", body)
        async with httpx.AsyncClient(base_url=url) as http:
            await http.post("/refunds", json=body, headers={"Idempotency-Key": called.key})
        assert check_unplanned(sim, payments, [PLAN]).count("unwanted effects") == 1
        asked = WorkflowPlan(WF, (Step("tool", "refund it", (500,), verb="refunded"),), ())
        assert check_unplanned(sim, payments, [asked]).violations == []


def test_a_user_flow_returns_its_last_stored_turn_and_archives_its_chat() -> None:
    results: list[dict[str, object]] = [{"step": 1, "text": "done", "chat_id": "c1"}]
    outcome = WorkflowOutcome(PLAN, results=results, returned=Returned("done"))
    assert check_returned(outcome).violations == []
    assert check_archived_at_end(outcome, {"c1"}).violations == []
    assert check_archived_at_end(outcome, set()).count("live orphans") == 1
    outcome.returned = Returned("something else")
    assert check_returned(outcome).count("lost results") == 1
    # A workflow no run completed is judged by its lost results alone.
    assert check_archived_at_end(WorkflowOutcome(PLAN), set()).violations == []


# -- live orphans and token leaks -----------------------------------------------------------------


async def test_an_unarchived_chat_of_the_workflow_is_a_live_orphan(sim: Simulator) -> None:
    async with Wire(sim) as wire:
        chat = await labelled_chat(wire, prompt())
        await sim.wait_for_status(chat, "waiting")
        assert check_orphans(sim, [WF]).count("live orphans") == 1
        assert check_orphans(sim, ["wf-other"]).violations == []
        await wire.http.patch(f"{V2}/{chat}", json={"archived": True})
    assert check_orphans(sim, [WF]).violations == []


def test_the_token_is_found_in_any_place_and_only_there() -> None:
    token = "tok_" + "x" * 28
    places = {"store a": b"clean", "home b": f"..{token}..".encode()}
    assert [v.detail for v in check_leaks(places, token).violations] == [
        "the session token is in home b"
    ]
    index = TokenIndex([token, "other-token-0123456789abcdef0123"])
    assert index.found(f'{{"x": "{token}", "id": "3fa85f64-5717"}}'.encode()) == {token}
    assert index.found(b"nothing of the sort") == set()


@pytest.mark.usefixtures("prefect_api")
async def test_the_api_search_reads_log_lines_artifacts_and_parameters() -> None:
    token = "campaign-test-token-" + "q" * 12
    since = utcnow()

    @flow(name="campaign-leaky")
    async def leaky(secret: str) -> None:
        get_run_logger().info(f"about to leak {secret}")
        await acreate_markdown_artifact(markdown=f"leaked: {secret}", key="campaign-leaky")

    await leaky(token)
    places: list[str] = []
    for _ in range(100):  # log lines reach the API in batches
        places = (await api_leaks([token], since)).get(token, [])
        if any(p.startswith("log ") for p in places):
            break
        await asyncio.sleep(0.1)
    assert any(p.startswith("flow run ") for p in places), places
    assert any(p.startswith("log ") for p in places), places
    assert any(p.startswith("artifact campaign-leaky") for p in places), places
    assert await api_leaks(["never-there-" + "z" * 20], since) == {}
