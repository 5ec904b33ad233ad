"""The sweep against the simulator and a real SQLite store: what it retires, keeps and reports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from coder_chat import ChatClient
from coder_chat.durable.context import StepTools
from coder_chat.durable.markers import chat_labels
from coder_chat.durable.records import WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.durable.sweep import NOT_RUN, SweepPolicy, sweep
from coder_chat.simulator import Simulator
from tests.simulator.wire import Wire, declare

TOOLS = declare("charge_card")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "ledger.db")
    yield s
    await s.close()


async def labelled(wire: Wire, workflow: str, text: str, **extra: object) -> str:
    chat = await wire.create(text, labels=chat_labels(workflow, 1, "local"), **TOOLS, **extra)
    return str(chat["id"])


def policy(**overrides: object) -> SweepPolicy:
    base = SweepPolicy(
        orphan_age=0,
        stuck_after=3600,
        interrupt_timeout=5,
        settle_timeout=10,
        poll_interval=0.02,
        archive_retry_interval=0.05,
    )
    for key, value in overrides.items():
        setattr(base, key, value)
    return base


async def test_orphans_are_retired_and_owned_chats_kept(sim: Simulator, store: SqliteStore) -> None:
    tenant = str(sim.organization_id)
    async with Wire(sim) as wire, ChatClient(base_url=sim.base_url, token=sim.token) as client:
        owned = await labelled(wire, "wf-owned", "mine")
        orphan_done = await labelled(wire, "wf-gone", "finished orphan")
        orphan_live = await labelled(wire, "wf-gone-2", "live orphan /sleep 30")
        orphan_paused = await labelled(wire, "wf-gone-3", '/tool charge_card {"amount_cents": 5}')
        unlabelled = str((await wire.create("not ours"))["id"])
        fence = await store.begin_run(tenant, "wf-owned")
        await store.save_checkpoint(fence, owned, None)
        await sim.wait_for_status(orphan_paused, "requires_action")
        await sim.wait_for_status(orphan_done, "waiting")
        report = await sweep(client, store, tenant, policy(), report=lambda _: None)
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
    # The paused orphan had no ledger entry: its call is answered "not run", never executed.
    synthetic = [r for r in sim.records.tool_results if str(r.chat_id) == orphan_paused]
    assert [r.output for r in synthetic][:1] == [NOT_RUN]


async def test_a_paused_orphan_is_answered_from_the_ledger_first(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    async with Wire(sim) as wire, ChatClient(base_url=sim.base_url, token=sim.token) as client:
        paused = await labelled(wire, "wf-crashed", '/tool charge_card {"amount_cents": 700}')
        record = await sim.wait_for_status(paused, "requires_action")
        call_id = record.pending_calls[0].tool_call_id
        fence = await store.begin_run(tenant, "wf-crashed")
        await store.claim_tool(fence, paused, call_id, tool_name="charge_card")
        await store.complete_tool(fence, paused, call_id, output="charged: receipt r-1")
        await store.finish(fence, WorkflowState.FAILED)  # its workflow ended: nobody will adopt it
        await sweep(client, store, tenant, policy(), report=lambda _: None)
    submitted = [r for r in sim.records.tool_results if r.tool_call_id == call_id]
    assert [(r.output, r.synthetic) for r in submitted] == [("charged: receipt r-1", False)]
    assert sim.chat(paused).archived


async def test_a_committing_effect_without_its_tool_is_left_alone(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    async with Wire(sim) as wire, ChatClient(base_url=sim.base_url, token=sim.token) as client:
        paused = await labelled(wire, "wf-ambiguous", '/tool charge_card {"amount_cents": 700}')
        record = await sim.wait_for_status(paused, "requires_action")
        fence = await store.begin_run(tenant, "wf-ambiguous")
        await store.claim_tool(
            fence, paused, record.pending_calls[0].tool_call_id, tool_name="charge_card"
        )
        await store.finish(fence, WorkflowState.FAILED)
        report = await sweep(
            client, store, tenant, policy(), tools=StepTools(), report=lambda _: None
        )
    assert [f.action for f in report.findings] == ["left"]
    assert sim.chat(paused).status == "requires_action" and not sim.chat(paused).archived
    assert not [r for r in sim.records.interrupts if str(r.chat_id) == paused]


async def test_dry_run_changes_nothing_and_young_chats_wait(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    async with Wire(sim) as wire, ChatClient(base_url=sim.base_url, token=sim.token) as client:
        orphan = await labelled(wire, "wf-x", "hello")
        await sim.wait_for_status(orphan, "waiting")
        dry = await sweep(client, store, tenant, policy(dry_run=True), report=lambda _: None)
        young = await sweep(client, store, tenant, policy(orphan_age=3600), report=lambda _: None)
    assert [f.action for f in dry.findings] == ["would retire"]
    assert [f.action for f in young.findings] == ["too young"]
    assert not sim.chat(orphan).archived and not sim.records.interrupts


async def test_stuck_turns_are_interrupted_and_stale_workflows_reported(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    async with Wire(sim) as wire, ChatClient(base_url=sim.base_url, token=sim.token) as client:
        stuck = await labelled(wire, "wf-stuck", "long /sleep 30")
        fence = await store.begin_run(tenant, "wf-stuck")
        await store.save_checkpoint(fence, stuck, None)
        report = await sweep(
            client, store, tenant, policy(stuck_after=0, stale_heartbeat=0), report=lambda _: None
        )
    assert [f.action for f in report.findings] == ["interrupted"]
    assert [r.status_before for r in sim.records.interrupts] == ["running"]
    assert not sim.chat(
        stuck
    ).archived  # a stuck turn is stopped, not retired: its workflow owns it
    assert [w.workflow_id for w in report.stranded] == ["wf-stuck"]


async def test_an_orphan_of_a_running_workflow_is_left_for_adoption(
    sim: Simulator, store: SqliteStore
) -> None:
    tenant = str(sim.organization_id)
    async with Wire(sim) as wire, ChatClient(base_url=sim.base_url, token=sim.token) as client:
        orphan = await labelled(wire, "wf-alive", "first attempt")
        discarded = await labelled(wire, "wf-alive", "discarded attempt")
        fence = await store.begin_run(tenant, "wf-alive")  # running, empty checkpoint
        await store.mark_discarded(fence, discarded)
        await sim.wait_for_status(orphan, "waiting")
        report = await sweep(client, store, tenant, policy(), report=lambda _: None)
    actions = {f.chat_id: f.action for f in report.findings}
    assert actions == {orphan: "kept", discarded: "archived"}
    assert not sim.chat(orphan).archived and sim.chat(discarded).archived
