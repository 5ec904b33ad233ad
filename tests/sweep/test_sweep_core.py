"""The sweep against the simulator and a real SQLite store: what it retires, keeps and reports."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from coder_chat import ChatClient
from coder_chat.client.options import ChatOptions
from coder_chat.durable.context import DurableOptions, StepTools
from coder_chat.durable.markers import chat_labels
from coder_chat.durable.reconcile import NO_RESULT
from coder_chat.durable.records import Fence, WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.sweep import SweepPolicy, SweepReport, mark_failed, sweep
from coder_chat.simulator import Simulator
from tests.simulator.wire import Wire, declare

TOOLS = declare("charge_card")
#: One pass of the sweep with a policy (and options such as ``tools``).
Sweep = Callable[..., Awaitable[SweepReport]]


async def labelled(
    wire: Wire, store: SqliteStore, workflow: str, text: str, **extra: object
) -> str:
    labels = chat_labels(workflow, 1, "local", await store.store_id())
    chat = await wire.create(text, labels=labels, **TOOLS, **extra)
    return str(chat["id"])


@asynccontextmanager
async def swept_by(sim: Simulator, store: SqliteStore) -> AsyncIterator[Sweep]:
    """A sweep of the simulator's chats with ``store``'s ledger, its report lines dropped."""
    tenant = str(sim.organization_id)
    async with ChatClient(base_url=sim.base_url, token=sim.token) as client:

        async def run_sweep(policy: SweepPolicy, **options: Any) -> SweepReport:
            return await sweep(client, store, tenant, policy, report=lambda _: None, **options)

        yield run_sweep


async def running(
    sim: Simulator, store: SqliteStore, workflow: str, checkpoint: str | None = None
) -> None:
    """``workflow`` begun in ``store`` (running), its checkpoint at chat ``checkpoint``."""
    fence = await store.begin_run(str(sim.organization_id), workflow)
    if checkpoint is not None:
        await store.save_checkpoint(fence, checkpoint, None)


async def claimed_charge(
    sim: Simulator, wire: Wire, store: SqliteStore, workflow: str
) -> tuple[str, str, Fence]:
    """A labelled chat of ``workflow`` paused on a charge_card call its ledger has claimed
    (a run that crashed before the effect was known): the chat, the call and the fence."""
    paused = await labelled(wire, store, workflow, '/tool charge_card {"amount_cents": 700}')
    record = await sim.wait_for_status(paused, "requires_action")
    call_id = record.pending_calls[0].tool_call_id
    fence = await store.begin_run(str(sim.organization_id), workflow)
    await store.claim_tool(fence, paused, call_id, tool_name="charge_card")
    return paused, call_id, fence


def policy(**overrides: object) -> SweepPolicy:
    timers = DurableOptions(
        chat=ChatOptions(interrupt_timeout=5, archive_retry_interval=0.05), poll_interval=0.02
    )
    base = SweepPolicy(orphan_age=0, stuck_after=3600, options=timers)
    for key, value in overrides.items():
        setattr(base, key, value)
    return base


async def test_orphans_are_retired_and_owned_chats_kept(sim: Simulator, store: SqliteStore) -> None:
    tenant = str(sim.organization_id)
    async with Wire(sim) as wire, swept_by(sim, store) as run_sweep:
        owned = await labelled(wire, store, "wf-owned", "mine")
        orphan_done = await labelled(wire, store, "wf-gone", "finished orphan")
        orphan_live = await labelled(wire, store, "wf-gone-2", "live orphan /sleep 30")
        orphan_paused = await labelled(
            wire, store, "wf-gone-3", '/tool charge_card {"amount_cents": 5}'
        )
        unlabelled = str((await wire.create("not ours"))["id"])
        fence = await store.begin_run(tenant, "wf-owned")
        await store.save_checkpoint(fence, owned, None)
        await sim.wait_for_status(orphan_paused, "requires_action")
        await sim.wait_for_status(orphan_done, "waiting")
        report = await run_sweep(policy())
    actions = {f.chat_id: f.action for f in report.findings}
    assert actions == {
        owned: "kept",
        orphan_done: "archived",
        orphan_live: "archived",
        orphan_paused: "archived",
    }
    assert unlabelled not in actions and report.chats_seen == 4
    assert not sim.chat(owned).archived and not sim.chat(unlabelled).archived
    for chat in (orphan_done, orphan_live, orphan_paused):
        assert sim.chat(chat).archived
    # The paused orphan had no ledger entry and the sweep has no tools: its call is
    # answered "no result recorded", never executed.
    synthetic = [r for r in sim.records.tool_results if str(r.chat_id) == orphan_paused]
    assert [r.output for r in synthetic][:1] == [NO_RESULT]


async def test_a_paused_orphan_is_answered_from_the_ledger_first(
    sim: Simulator, store: SqliteStore
) -> None:
    async with Wire(sim) as wire, swept_by(sim, store) as run_sweep:
        paused, call_id, fence = await claimed_charge(sim, wire, store, "wf-crashed")
        await store.complete_tool(fence, paused, call_id, output="charged: receipt r-1")
        await store.finish(fence, WorkflowState.FAILED)  # its workflow ended: nobody will adopt it
        await run_sweep(policy())
    submitted = [r for r in sim.records.tool_results if r.tool_call_id == call_id]
    assert [(r.output, r.synthetic) for r in submitted] == [("charged: receipt r-1", False)]
    assert sim.chat(paused).archived


async def test_a_committing_effect_without_its_tool_is_left_alone(
    sim: Simulator, store: SqliteStore
) -> None:
    async with Wire(sim) as wire, swept_by(sim, store) as run_sweep:
        paused, _, fence = await claimed_charge(sim, wire, store, "wf-ambiguous")
        await store.finish(fence, WorkflowState.FAILED)
        report = await run_sweep(policy(), tools=StepTools())
    assert [f.action for f in report.findings] == ["left"]
    assert sim.chat(paused).status == "requires_action" and not sim.chat(paused).archived
    assert not [r for r in sim.records.interrupts if str(r.chat_id) == paused]


async def test_dry_run_changes_nothing_and_young_chats_wait(
    sim: Simulator, store: SqliteStore
) -> None:
    async with Wire(sim) as wire, swept_by(sim, store) as run_sweep:
        orphan = await labelled(wire, store, "wf-x", "hello")
        await sim.wait_for_status(orphan, "waiting")
        dry = await run_sweep(policy(dry_run=True))
        young = await run_sweep(policy(orphan_age=3600))
    assert [f.action for f in dry.findings] == ["would retire"]
    assert [f.action for f in young.findings] == ["too young"]
    assert not sim.chat(orphan).archived and not sim.records.interrupts


async def test_stuck_turns_are_interrupted_and_stale_workflows_reported(
    sim: Simulator, store: SqliteStore
) -> None:
    async with Wire(sim) as wire, swept_by(sim, store) as run_sweep:
        stuck = await labelled(wire, store, "wf-stuck", "long /sleep 30")
        await running(sim, store, "wf-stuck", checkpoint=stuck)
        report = await run_sweep(policy(stuck_after=0, stale_heartbeat=0))
    assert [f.action for f in report.findings] == ["interrupted"]
    assert [r.status_before for r in sim.records.interrupts] == ["running"]
    assert not sim.chat(
        stuck
    ).archived  # a stuck turn is stopped, not retired: its workflow owns it
    assert [w.workflow_id for w in report.stranded] == ["wf-stuck"]


async def test_an_orphan_of_a_running_workflow_is_left_for_adoption(
    sim: Simulator, store: SqliteStore
) -> None:
    async with Wire(sim) as wire, swept_by(sim, store) as run_sweep:
        orphan = await labelled(wire, store, "wf-alive", "first attempt")
        await running(sim, store, "wf-alive")  # an empty checkpoint
        await sim.wait_for_status(orphan, "waiting")
        report = await run_sweep(policy())
    assert {f.chat_id: f.action for f in report.findings} == {orphan: "kept"}
    assert not sim.chat(orphan).archived


async def test_a_sweep_acts_only_on_its_own_stores_chats(
    sim: Simulator, store: SqliteStore, tmp_path: Path
) -> None:
    """Two stores, one deployment label: each sweep sees only the chats its store made."""
    other = SqliteStore(tmp_path / "other.db")
    try:
        assert await other.store_id() != await store.store_id()
        async with Wire(sim) as wire, swept_by(sim, store) as run_sweep:
            mine = await labelled(wire, store, "wf-a", "mine")
            theirs = await labelled(wire, other, "wf-b", "theirs")
            await sim.wait_for_status(theirs, "waiting")
            report = await run_sweep(policy())
    finally:
        await other.close()
    assert [f.chat_id for f in report.findings] == [mine] and report.chats_seen == 1
    assert sim.chat(mine).archived and not sim.chat(theirs).archived


async def test_an_ended_workflow_that_did_not_archive_has_its_chat_retired(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    async with Wire(sim) as wire, swept_by(sim, store) as run_sweep:
        failed = await labelled(wire, store, "wf-failed", "it failed")
        kept = await labelled(wire, store, "wf-keep", "keep me")
        for workflow, chat, archive in (("wf-failed", failed, True), ("wf-keep", kept, False)):
            fence = await store.begin_run(tenant, workflow, archive_at_end=archive)
            await store.save_checkpoint(fence, chat, None)
            await store.finish(fence, WorkflowState.FAILED)
            await sim.wait_for_status(chat, "waiting")
        report = await run_sweep(policy())
    assert {f.chat_id: f.action for f in report.findings} == {failed: "archived", kept: "kept"}
    assert sim.chat(failed).archived and not sim.chat(kept).archived


async def test_mark_failed_fences_out_the_run_and_ends_the_workflow(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    fence = await store.begin_run(tenant, "wf-dead", flow_run_id="run-1", archive_at_end=False)
    workflow = await store.get_workflow(tenant, "wf-dead")
    assert workflow is not None
    await mark_failed(store, workflow)
    after = await store.get_workflow(tenant, "wf-dead")
    assert after is not None
    assert (after.state, after.flow_run_id, after.archive_at_end) == ("failed", "run-1", False)
    assert after.epoch == fence.epoch + 1
