"""run_step against the simulator and a real SQLite store, in one process."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from coder_chat import (
    ChatClient,
    ChatSession,
    CoderChatError,
    CoderConfigError,
    CoderStreamError,
    is_retryable,
)
from coder_chat.client.tools import ToolFailed
from coder_chat.durable.context import DurableOptions, StepContext, StepTools
from coder_chat.durable.markers import LABEL_STEP, LABEL_STORE, LABEL_WORKFLOW, chat_labels
from coder_chat.durable.reconcile import answer_pause
from coder_chat.durable.records import JournalEntry, PromptChanged, args_digest, utcnow
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.step import StepResult, StepSpec, run_step
from coder_chat.durable.tools import durable_tool
from coder_chat.errors import CoderToolError
from coder_chat.simulator import Simulator, SimulatorConfig, serve_simulator
from tests.lab.truth import committed_usage
from tests.sim_timings import fast_config
from tests.simulator.wire import Wire

from .support import (
    CHARGES,
    FAST,
    charge_card,
    crashed_attempt,
    deadline_answers_twice,
    first_step,
    left_charge_step,
    user_messages,
)


async def test_three_steps_then_a_rerun_comes_from_the_store(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    CHARGES.clear()
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-1")
        tools = StepTools.build([charge_card])
        prompts = ["plan it", 'pay /tool charge_card {"amount_cents": 500}', "summarise"]
        results = []
        for step, prompt in enumerate(prompts, start=1):
            ctx = StepContext.fenced(client, store, fence, "wf-1", step, tools, FAST)
            results.append(await run_step(ctx, StepSpec(prompt=prompt)))
        assert [r.verdict for r in results] == ["ran", "ran", "ran"]
        assert results[0].text == 'You said: "[wf-1/step-1] plan it"'
        assert "receipt-1" in results[1].text
        chat_id = results[0].chat_id
        assert {r.chat_id for r in results} == {chat_id}
        labels = sim.chat(chat_id).labels
        assert labels[LABEL_WORKFLOW] == "wf-1" and labels[LABEL_STEP] == "1"
        assert labels[LABEL_STORE] == await store.store_id()
        assert (
            len(CHARGES) == 1
            and CHARGES[0][1] == f"{tenant}/{chat_id}/" + CHARGES[0][1].split("/")[-1]
        )
        requests = len(sim.records.requests)

        # A re-run of a finished step, in a new run of the workflow, reads the store
        # and talks to no one: not a request reaches the server.
        rerun = await store.begin_run(tenant, "wf-1")
        again = await run_step(
            StepContext.fenced(client, store, rerun, "wf-1", 2, tools, FAST),
            StepSpec(prompt=prompts[1]),
        )
        assert again.verdict == "stored"
        assert (again.text, again.chat_id) == (results[1].text, chat_id)
        assert len(sim.records.requests) == requests and len(CHARGES) == 1
        with pytest.raises(
            CoderConfigError, match=r"already finished and is never run again: it ran .pay /tool"
        ):
            await run_step(
                StepContext.fenced(client, store, rerun, "wf-1", 2, tools, FAST),
                StepSpec(prompt="pay twice"),
            )
    stored = await store.list_steps(tenant, "wf-1")
    assert [(s.step, s.verdict, s.text) for s in stored] == [
        (r.step, "ran", r.text) for r in results
    ]


async def test_a_finished_attempt_whose_result_was_lost_is_recovered(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-lost")
        first = await first_step(client, store, fence)
        ctx = StepContext.fenced(client, store, fence, "wf-lost", 2, StepTools(), FAST)
        await crashed_attempt(client, store, ctx, first.chat_id, "summarise")
        await sim.wait_for_status(first.chat_id, "waiting")
        recovered = await run_step(ctx, StepSpec(prompt="summarise"))
        users = await user_messages(client, first.chat_id)
    assert recovered.verdict == "recovered"
    assert recovered.text == 'You said: "[wf-lost/step-2] summarise"'
    assert len(users) == 2  # nothing was sent again
    # What the attempt used is counted once, from the chat: the two steps, the chat's all.
    assert recovered.usage.messages == 1
    assert first.usage + recovered.usage == committed_usage([sim.chat(first.chat_id)])
    stored = await store.get_step(tenant, "wf-lost", 2)
    assert stored is not None and stored.verdict == "recovered"


async def test_a_live_run_left_by_a_crash_is_left_to_finish(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-live")
        first = await first_step(client, store, fence)
        ctx = StepContext.fenced(client, store, fence, "wf-live", 2, StepTools(), FAST)
        await crashed_attempt(client, store, ctx, first.chat_id, "work slowly /sleep 0.5")
        assert sim.chat(first.chat_id).status == "running"
        recovered = await run_step(ctx, StepSpec(prompt="work slowly /sleep 0.5"))
    assert recovered.verdict == "recovered" and "work slowly" in recovered.text
    assert not sim.records.interrupts  # the crashed attempt's work was not thrown away


async def test_a_live_run_past_the_settle_budget_is_cut_and_resubmitted(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    impatient = replace(FAST, settle_timeout=0.3)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-slow")
        first = await first_step(client, store, fence, impatient)
        ctx = StepContext.fenced(client, store, fence, "wf-slow", 2, StepTools(), impatient)
        # The crashed attempt's run writes a step (a tool Coder runs), then stalls.
        sim.script("stall", '/server-tool read_file {"path": "a"} /sleep 30', times=1)
        await crashed_attempt(client, store, ctx, first.chat_id, "stall")
        again = await run_step(ctx, StepSpec(prompt="stall"))
        users = await user_messages(client, first.chat_id)
    assert again.verdict == "resubmitted"
    assert [i.status_before for i in sim.records.interrupts] == ["running"]
    assert len(users) == 3 and again.text == 'You said: "[wf-slow/step-2] stall"'
    # Both attempts are counted, each message once: the cut one's step and the resend's.
    assert again.usage.messages == 2
    assert first.usage + again.usage == committed_usage([sim.chat(first.chat_id)])


async def test_a_lost_stream_keeps_the_chat_and_the_retry_recovers_the_turn(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    sim.faults.drop_streams(after_events=0, times=5)  # exactly the redial budget
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-stream")
        ctx = StepContext.fenced(client, store, fence, "wf-stream", 1, StepTools(), FAST)
        with pytest.raises(CoderStreamError) as caught:
            await run_step(ctx, StepSpec(prompt="hello"))
        assert caught.value.retryable  # the durable layer can always recover a lost stream
        lost = caught.value.chat_id
        assert lost is not None and not sim.chat(lost).archived
        workflow = await store.get_workflow(tenant, "wf-stream")
        assert workflow is not None and workflow.chat_id == lost  # kept, checkpointed
        retried = await run_step(ctx, StepSpec(prompt="hello"))
        users = await user_messages(client, lost)
    assert (retried.chat_id, retried.verdict) == (lost, "recovered")
    assert retried.text == 'You said: "[wf-stream/step-1] hello"'
    assert len(users) == 1  # the turn ran once, on the chat it created


async def test_two_parallel_calls_one_booked_one_never_started(
    sim: Simulator, store: SqliteStore
) -> None:
    """A crash between two parallel durable calls: both are answered in one request,
    the booked one from the ledger, the other run now under its own key."""
    prompt = 'pay /tool charge_card {"amount_cents": 100} /tool charge_card {"amount_cents": 200}'
    async with left_charge_step(sim, store, "wf-pair", prompt) as (ctx, chat_id):
        paused = await sim.wait_for_status(chat_id, "requires_action")
        booked, never = (c.tool_call_id for c in paused.pending_calls)
        await store.claim_tool(ctx.fence, chat_id, booked, tool_name="charge_card")
        await store.complete_tool(ctx.fence, chat_id, booked, output="receipt-booked")
        result = await run_step(ctx, StepSpec(prompt=prompt))
    assert result.verdict == "recovered" and result.chat_id == chat_id
    submissions = [r for r in sim.records.tool_results if str(r.chat_id) == chat_id]
    assert {r.tool_call_id: r.output for r in submissions} == {
        booked: "receipt-booked",
        never: "receipt-1",
    }
    assert [key.rsplit("/", 1)[-1] for _, key in CHARGES] == [never]  # only the unstarted ran
    assert "receipt-booked" in result.text and "receipt-1" in result.text


async def test_a_late_prompts_pause_starts_nothing_new(sim: Simulator, store: SqliteStore) -> None:
    """Step 1's prompt lands a second time (a send that arrived late) and its turn calls
    the tool again; recovering step 2 meets that pause. The repeated call is answered
    with step 1's recorded outcome and nothing is charged again."""
    tenant = str(sim.organization_id)
    CHARGES.clear()
    prompt = 'pay /tool charge_card {"amount_cents": 400}'
    tools = StepTools.build([charge_card])
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-late")
        step_1 = StepContext.fenced(client, store, fence, "wf-late", 1, tools, FAST)
        first = await run_step(step_1, StepSpec(prompt=prompt))
        await client.send_message(first.chat_id, f"{step_1.marker} {prompt}")  # the late one
        await sim.wait_for_status(first.chat_id, "requires_action")
        step_2 = StepContext.fenced(client, store, fence, "wf-late", 2, tools, FAST)
        answer = await answer_pause(step_2, first.chat_id, "resume")
        await sim.wait_for_status(first.chat_id, "waiting")
    assert (answer.recorded, answer.ran, len(answer.results)) == (1, 0, 1)
    assert answer.results[0]["output"] == "receipt-1" and len(CHARGES) == 1
    entries = await store.list_tools(tenant, first.chat_id)
    assert [e.marker for e in entries] == [step_1.marker] * 2  # both calls, step 1's


async def test_an_attempt_that_never_saw_its_tools_outcome_goes_again(
    sim: Simulator, store: SqliteStore
) -> None:
    """The process died after the charge was booked; recovery came only after Coder's
    tool deadline had answered the call, and the model's call again, with "timed out",
    and the turn had finished. That attempt never saw what the tool did: the step goes
    again and learns it from the ledger, and the card is not charged twice."""
    prompt = 'pay /tool charge_card {"amount_cents": 600}'
    async with left_charge_step(sim, store, "wf-deadline-twice", prompt) as (ctx, chat_id):
        fence = ctx.fence
        paused = await sim.wait_for_status(chat_id, "requires_action")
        call = paused.pending_calls[0].tool_call_id
        digest = args_digest(charge_card.tool.validate({"amount_cents": 600}).model_dump())
        await store.claim_tool(
            fence, chat_id, call, tool_name="charge_card", marker=ctx.marker, args_digest=digest
        )
        await store.complete_tool(fence, chat_id, call, output="receipt-booked")
        await store.save_checkpoint(fence, chat_id, None)
        await deadline_answers_twice(sim, chat_id)
        result = await run_step(ctx, StepSpec(prompt=prompt))
    assert result.verdict == "resubmitted"
    assert "receipt-booked" in result.text and not CHARGES
    users = [m.text() for m in sim.messages(chat_id) if m.role == "user"]
    assert len(users) == 2 and "charge_card already ran for this step" in users[1]


async def test_a_call_that_never_ran_before_coders_tool_deadline_is_run_on_resubmission(
    sim: Simulator, store: SqliteStore
) -> None:
    """The process died before running the step's tool; Coder's deadline answered the
    call (and the model's call again) with "timed out" and the turn finished. The
    effect never happened because of the crash: the step goes again, and runs it once."""
    prompt = 'pay /tool charge_card {"amount_cents": 800}'
    async with left_charge_step(sim, store, "wf-never-ran", prompt) as (ctx, chat_id):
        await store.save_checkpoint(ctx.fence, chat_id, None)
        await deadline_answers_twice(sim, chat_id)
        result = await run_step(ctx, StepSpec(prompt=prompt))
    assert result.verdict == "resubmitted"
    assert [amount for amount, _ in CHARGES] == [800]  # run once, by the resubmission
    assert "receipt-1" in result.text


SLOW_RUNS: list[str] = []
SIM_CONFIG: list[SimulatorConfig] = []


@durable_tool
async def slow_charge(amount_cents: int, idempotency_key: str) -> str:
    """Charge, slower than the server's tool deadline."""
    # The first call's 0.3 s deadline is already running; give the model's second
    # call (after the server times this one out) a deadline it can meet.
    asyncio.get_running_loop().call_later(0.1, setattr, SIM_CONFIG[0], "tool_result_deadline", 5.0)
    await asyncio.sleep(0.6)
    SLOW_RUNS.append(idempotency_key)
    return f"charged {amount_cents}"


async def test_a_tool_the_server_timed_out_is_answered_from_the_ledger_when_called_again(
    tmp_path: Path, store: SqliteStore
) -> None:
    SLOW_RUNS.clear()
    config = fast_config(tool_result_deadline=0.3)
    SIM_CONFIG[:] = [config]
    async with serve_simulator(config) as sim:
        tenant = str(sim.organization_id)
        async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
            fence = await store.begin_run(tenant, "wf-deadline")
            ctx = StepContext.fenced(
                client, store, fence, "wf-deadline", 1, StepTools.build([slow_charge]), FAST
            )
            result = await run_step(
                ctx, StepSpec(prompt='pay /tool slow_charge {"amount_cents": 9}')
            )
        results = [r for r in sim.records.tool_results if r.tool_name == "slow_charge"]
    # The server timed the first call out; the model called again with the same
    # arguments; the second call was answered from the first call's ledger entry.
    assert [(r.synthetic, r.output) for r in results] == [
        (True, "Tool execution timed out"),
        (False, "charged 9"),
    ]
    assert len(SLOW_RUNS) == 1  # the effect ran once
    entries = await store.list_tools(tenant, result.chat_id)
    assert [e.state for e in entries] == ["done", "done"]
    assert entries[0].output == entries[1].output == "charged 9"


async def test_a_resubmitted_step_is_told_what_its_tools_already_did(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    CHARGES.clear()
    prompt = 'pay /tool charge_card {"amount_cents": 300}'
    tools = StepTools.build([charge_card])
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-notes")
        first = await run_step(
            StepContext.fenced(client, store, fence, "wf-notes", 1, tools, FAST),
            StepSpec(prompt="hi"),
        )
        ctx = StepContext.fenced(client, store, fence, "wf-notes", 2, tools, FAST)
        # An attempt that ran its tool and then timed out: the timeout fired an
        # interrupt, so recovery must treat it as cut short and resubmit.
        session = ChatSession(
            client=client,
            organization_id=tenant,
            chat_id=first.chat_id,
            tools=tools.for_session(ctx.binding),
        )
        await session.generate(f"{ctx.marker} {prompt}")
        entry = JournalEntry(state="submitting", marker=ctx.marker, attempt=0, reason="timeout")
        await store.write_journal(fence, first.chat_id, entry)
        again = await run_step(ctx, StepSpec(prompt=prompt))
    assert again.verdict == "resubmitted"
    users = [m.text() for m in sim.messages(first.chat_id) if m.role == "user"]
    assert len(users) == 3 and "charge_card already ran for this step" in users[2]
    assert len(CHARGES) == 1  # the resubmitted step's call was answered from the ledger


async def test_a_recovery_read_that_runs_out_of_time_can_be_retried(
    sim: Simulator, store: SqliteStore
) -> None:
    """A chat read during recovery that outlasts its bound raises a retryable timeout
    (a bare TimeoutError would end a Prefect task for good); the next try recovers."""
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-slow-read")
        first = await first_step(client, store, fence)
        tight = replace(FAST, chat=replace(FAST.chat, interrupt_timeout=0.3))
        ctx = StepContext.fenced(client, store, fence, "wf-slow-read", 2, StepTools(), tight)
        await crashed_attempt(client, store, ctx, first.chat_id, "summarise")
        await sim.wait_for_status(first.chat_id, "waiting")
        sim.faults.hold("get_chat", "before")
        with pytest.raises(CoderChatError) as raised:
            await asyncio.wait_for(run_step(ctx, StepSpec(prompt="summarise")), timeout=30)
        assert raised.value.kind == "timeout" and is_retryable(raised.value)
        sim.faults.decide((await sim.faults.wait_held("get_chat")).id, "release")
        recovered = await run_step(ctx, StepSpec(prompt="summarise"))
    assert recovered.verdict == "recovered"


async def test_an_attempt_sent_with_another_prompt_is_refused_before_anything_runs(
    sim: Simulator, store: SqliteStore
) -> None:
    """A crashed attempt of step 2 paused on a durable tool; the re-run's code now asks
    step 2 something else (a person answered otherwise on the relaunch). The step is
    refused before its pause is answered: the tool does not run, nothing is submitted."""
    tenant = str(sim.organization_id)
    CHARGES.clear()
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-asked")
        tools = StepTools.build([charge_card])
        step_1 = StepContext.fenced(client, store, fence, "wf-asked", 1, tools, FAST)
        chat_id = (await run_step(step_1, StepSpec(prompt="plan it"))).chat_id
        step_2 = replace(step_1, step=2)
        await crashed_attempt(
            client, store, step_2, chat_id, 'refund it /tool charge_card {"amount_cents": 900}'
        )
        await sim.wait_for_status(chat_id, "requires_action")
        with pytest.raises(PromptChanged, match=r"step 2 .* was already sent with another"):
            await run_step(step_2, StepSpec(prompt="the refund was declined"))
    assert CHARGES == []
    assert [r for r in sim.records.tool_results if str(r.chat_id) == chat_id] == []
    assert sim.chat(chat_id).status == "requires_action"


async def test_a_send_in_flight_that_lands_early_ends_the_wait_for_it(
    sim: Simulator, store: SqliteStore
) -> None:
    """The crashed attempt's send was journaled with a horizon ten minutes away and lands
    a moment after recovery began: recovery sees it land and takes its answer, without
    sitting out the horizon (the test's own timeout is far shorter) or sending again."""
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-early")
        first = await first_step(client, store, fence)
        ctx = StepContext.fenced(client, store, fence, "wf-early", 2, StepTools(), FAST)
        far = utcnow() + timedelta(minutes=10)
        entry = JournalEntry(state="submitting", marker=ctx.marker, attempt=0, horizon=far)
        await store.write_journal(fence, first.chat_id, entry)
        sim.faults.delay_commit("send_message", 0.5)
        late = asyncio.create_task(client.send_message(first.chat_id, f"{ctx.marker} summarise"))
        recovered = await run_step(ctx, StepSpec(prompt="summarise"))
        await late
        users = await user_messages(client, first.chat_id)
    assert recovered.verdict == "recovered"
    assert len(users) == 2  # the late send only; nothing was sent again


PAYMENTS_DOWN: list[bool] = []


@durable_tool
async def flaky_charge(amount_cents: int, idempotency_key: str) -> str:
    """Charge the card; the payments service may be unreachable."""
    if PAYMENTS_DOWN:
        PAYMENTS_DOWN.pop()
        raise ConnectionError("payments unreachable")
    CHARGES.append((amount_cents, idempotency_key))
    return f"receipt-{len(CHARGES)}"


@durable_tool
async def declined_charge(amount_cents: int, idempotency_key: str) -> str:
    """Charge the card; this card is always declined."""
    raise ToolFailed(f"card declined for {amount_cents} cents")


async def test_a_tool_whose_outcome_is_unknown_stops_the_turn_and_runs_again_once(
    sim: Simulator, store: SqliteStore
) -> None:
    """The payments service was unreachable: whether the charge happened is unknown, so
    the model is not told it failed. The turn stops (retryably), the pause stays, and the
    retry runs the call again under the same key: one charge, the model sees it."""
    tenant = str(sim.organization_id)
    CHARGES.clear()
    PAYMENTS_DOWN[:] = [True]
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-unknown")
        tools = StepTools.build([flaky_charge])
        ctx = StepContext.fenced(client, store, fence, "wf-unknown", 1, tools, FAST)
        spec = StepSpec(prompt='pay /tool flaky_charge {"amount_cents": 300}')
        with pytest.raises(CoderToolError) as unknown:
            await run_step(ctx, spec)
        assert is_retryable(unknown.value)
        [chat] = sim.chats()
        [entry] = await store.list_tools(tenant, str(chat.id))
        assert entry.state == "committing"
        assert sim.chat(entry.chat_id).status == "requires_action"
        again = await run_step(ctx, spec)
    assert again.verdict == "recovered" and "receipt-1" in again.text
    assert [key for _, key in CHARGES] == [entry.idempotency_key]


async def test_a_tool_that_fails_for_good_tells_the_model_and_keeps_the_outcome(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-declined")
        tools = StepTools.build([declined_charge])
        ctx = StepContext.fenced(client, store, fence, "wf-declined", 1, tools, FAST)
        result = await run_step(
            ctx, StepSpec(prompt='pay /tool declined_charge {"amount_cents": 5}')
        )
        [entry] = await store.list_tools(tenant, result.chat_id)
    assert "card declined for 5 cents" in result.text
    assert entry.state == "done" and entry.is_error and entry.output == "card declined for 5 cents"


async def test_a_timeout_whose_interrupt_found_nothing_running_is_recovered_not_resent(
    sim: Simulator, store: SqliteStore
) -> None:
    """The client never saw its turn end (its stream was refused) and timed out; the
    interrupt it sent found nothing running: the run had finished. That attempt was not
    cut short, so the retry takes its answer from the chat instead of sending again."""
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, "wf-idle")
        first = await first_step(client, store, fence)
        blind = replace(FAST, chat=replace(FAST.chat, request_timeout=0.5, redial_initial=5.0))
        ctx = StepContext.fenced(client, store, fence, "wf-idle", 2, StepTools(), blind)
        sim.faults.fail_next("stream", 503, count=50)
        with pytest.raises(CoderChatError) as timed_out:
            await run_step(ctx, StepSpec(prompt="summarise"))
        assert timed_out.value.kind == "timeout"
        assert [i.http_status for i in sim.records.interrupts] == [409]
        sim.faults.clear()
        again = await run_step(replace(ctx, options=FAST), StepSpec(prompt="summarise"))
        users = await user_messages(client, first.chat_id)
    assert again.verdict == "recovered"
    assert sum(1 for m in users if "[wf-idle/step-2]" in m.text()) == 1  # never sent again


async def lost_interrupt_then_retry(
    sim: Simulator, store: SqliteStore, workflow_id: str, retry: DurableOptions
) -> tuple[StepResult, int]:
    """Step 2's turn times out blind (its stream refused) after the run finished; the
    interrupt it sends is cut before it takes effect, so its outcome is unknown. Then
    the step runs again with ``retry``: its verdict, and how often step 2 was sent."""
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
        fence = await store.begin_run(tenant, workflow_id)
        first = await run_step(
            StepContext.fenced(client, store, fence, workflow_id, 1, StepTools(), FAST),
            StepSpec(prompt="plan it"),
        )
        blind = replace(FAST, chat=replace(FAST.chat, request_timeout=1.0, redial_initial=5.0))
        ctx = StepContext.fenced(client, store, fence, workflow_id, 2, StepTools(), blind)
        sim.faults.fail_next("stream", 503, count=50)
        sim.faults.cut_before_commit("interrupt")
        with pytest.raises(CoderChatError) as timed_out:
            await run_step(ctx, StepSpec(prompt="summarise"))
        assert timed_out.value.kind == "timeout"
        sim.faults.clear()
        record = await store.get_chat(tenant, first.chat_id)
        assert record is not None and record.journal is not None
        assert record.journal.reason == "timeout" and record.journal.stopped_at is not None
        again = await run_step(replace(ctx, options=retry), StepSpec(prompt="summarise"))
        users = await user_messages(client, first.chat_id)
    return again, sum(1 for m in users if f"[{workflow_id}/step-2]" in m.text())


async def test_an_attempt_finished_before_its_lost_interrupt_was_sent_is_recovered(
    sim: Simulator, store: SqliteStore
) -> None:
    """Whether the interrupt reached Coder is unknown, but Coder stamped the whole
    attempt well before it was sent (by more than the allowed clock skew): it cannot
    have cut it, so the retry takes the answer and sends nothing again."""
    again, sends = await lost_interrupt_then_retry(
        sim, store, "wf-lost-stop", replace(FAST, clock_skew=0.2)
    )
    assert again.verdict == "recovered" and sends == 1


async def test_a_lost_interrupt_within_the_clock_skew_still_cuts_the_attempt(
    sim: Simulator, store: SqliteStore
) -> None:
    """The same attempt, judged with a clock skew larger than the gap between its end
    and the interrupt: the interrupt may have cut it, so it is sent again."""
    again, sends = await lost_interrupt_then_retry(
        sim, store, "wf-lost-stop-skew", replace(FAST, clock_skew=30.0)
    )
    assert again.verdict == "resubmitted" and sends == 2


async def test_a_pause_answer_says_what_became_of_every_call(
    sim: Simulator, store: SqliteStore
) -> None:
    """Every answered call is counted under what was done with it: a tool this step does
    not have is refused, and the summary's counts add up to the calls answered."""
    tenant = str(sim.organization_id)
    tools = StepTools.build([charge_card])
    async with (
        Wire(sim) as wire,
        ChatClient(base_url=sim.base_url, token=sim.token) as client,
    ):
        fence = await store.begin_run(tenant, "wf-refused")
        ctx = StepContext.fenced(client, store, fence, "wf-refused", 1, StepTools(), FAST)
        declared = [
            t.declaration().model_dump(exclude_none=True) for t in tools.for_session(ctx.binding)
        ]
        chat = await wire.create(
            '[wf-refused/step-1] pay /tool charge_card {"amount_cents": 100}',
            labels=chat_labels("wf-refused", 1, "local", await store.store_id()),
            unsafe_dynamic_tools=declared,
        )
        await sim.wait_for_status(str(chat["id"]), "requires_action")
        answer = await answer_pause(ctx, str(chat["id"]), "resume")
    assert answer.summary() == (
        "answered 1 pending call(s): 1 refused (tool not available here, or bad arguments)"
    )
