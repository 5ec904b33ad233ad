"""``durable_chats``: many workflows in one flow run, each still its own durable workflow."""

from __future__ import annotations

import asyncio
import gc
import uuid
from datetime import datetime
from pathlib import Path

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

from coder_chat import CoderConfigError
from coder_chat.durable.markers import LABEL_WORKFLOW
from coder_chat.durable.records import WorkflowState
from coder_chat.durable.sqlite import SqliteStore
from coder_chat.simulator import Simulator
from prefect_coder import DurableChat, DurableFleet
from prefect_coder.flows.durable_chats import FleetFailed, WorkflowSpec, durable_chats

from .example_tools import FREEZE_COUNTS

pytestmark = pytest.mark.usefixtures("prefect_api")


def fleet(prefix: str, count: int, steps: int) -> list[WorkflowSpec]:
    return [
        WorkflowSpec(
            workflow_id=f"{prefix}-{i}", prompts=[f"step {k} of {prefix}-{i}" for k in range(steps)]
        )
        for i in range(count)
    ]


async def stored_states(
    sim: Simulator, db: Path, workflow_ids: list[str]
) -> dict[str, WorkflowState | None]:
    """Each workflow's state as the embedded store holds it (``None``: never begun)."""
    store = SqliteStore(db)
    try:
        records = [await store.get_workflow(str(sim.organization_id), w) for w in workflow_ids]
    finally:
        await store.close()
    return {w: r.state if r else None for w, r in zip(workflow_ids, records, strict=True)}


def chat_of(sim: Simulator, workflow_id: str) -> list[uuid.UUID]:
    return [c.id for c in sim.chats() if c.labels.get(LABEL_WORKFLOW) == workflow_id]


async def test_fifty_workflows_of_three_steps_in_one_flow_run(
    sim: Simulator, coder_env: Path
) -> None:
    workflows = fleet("fifty", 50, 3)
    results = await durable_chats(workflows=workflows)
    assert sorted(results) == sorted(w.workflow_id for w in workflows)
    store = SqliteStore(coder_env)
    try:
        for spec in workflows:
            steps = results[spec.workflow_id]
            assert [r.verdict for r in steps] == ["ran"] * 3
            [chat_id] = chat_of(sim, spec.workflow_id)  # one chat each, never shared
            assert {r.chat_id for r in steps} == {str(chat_id)}
            for step, result in enumerate(steps, start=1):
                marker = f"[{spec.workflow_id}/step-{step}]"
                assert result.text == f'You said: "{marker} {spec.prompts[step - 1]}"'
            assert sim.chat(chat_id).archived
            record = await store.get_workflow(str(sim.organization_id), spec.workflow_id)
            assert record is not None and record.state == WorkflowState.FINISHED
            assert record.epoch == 1 and record.chat_id == str(chat_id)
    finally:
        await store.close()


async def test_the_heap_found_at_the_start_is_frozen_while_the_fleet_runs(
    sim: Simulator, coder_env: Path
) -> None:
    """The collector skips what the process held before the fleet (Prefect and all it
    imports) while the workflows run, and has it all back once they are done."""
    FREEZE_COUNTS.clear()
    assert gc.get_freeze_count() == 0
    workflows = fleet("frozen", 2, 1)
    for spec in workflows:
        spec.prompts[0] = 'look /tool heap_probe {"note": "now"}'
    results = await durable_chats(
        workflows=workflows, tools=["tests.flows.example_tools:heap_probe"]
    )
    assert sorted(results) == ["frozen-0", "frozen-1"]
    assert len(FREEZE_COUNTS) == 2
    assert min(FREEZE_COUNTS) > 100_000  # the whole of Prefect, not a handful
    assert gc.get_freeze_count() == 0


def probing(prefix: str, count: int, steps: int) -> list[WorkflowSpec]:
    """Workflows whose every step calls ``heap_probe`` (it records the freeze count)."""
    workflows = fleet(prefix, count, steps)
    for spec in workflows:
        spec.prompts = [f'look /tool heap_probe {{"note": "{k}"}}' for k in range(steps)]
    return workflows


PROBE = ["tests.flows.example_tools:heap_probe"]


async def test_two_fleets_in_one_process_share_one_frozen_heap(
    sim: Simulator, coder_env: Path
) -> None:
    """The heap stays frozen while any fleet runs and is thawed when the last one ends:
    a fleet that ends first leaves it frozen for the other (every step of the longer
    fleet, its last ones too, finds it frozen), and it is thawed after both.

    Not checked: that the count never rises while frozen. One CI run saw a later step
    find more frozen objects than an earlier one, which only a second freeze explains;
    the two fleets may not overlap from the start (then a thaw and a new freeze between
    them are right), and what happened there is not known yet."""
    FREEZE_COUNTS.clear()
    assert gc.get_freeze_count() == 0
    await asyncio.gather(
        durable_chats(workflows=probing("pair-a", 1, 1), tools=PROBE),
        durable_chats(workflows=probing("pair-b", 2, 3), tools=PROBE),
    )
    assert len(FREEZE_COUNTS) == 7 and min(FREEZE_COUNTS) > 100_000
    assert gc.get_freeze_count() == 0


async def test_a_fleet_that_fails_still_thaws_the_heap(sim: Simulator, coder_env: Path) -> None:
    """A concurrency limit that does not exist fails the fleet while the heap is frozen."""
    assert gc.get_freeze_count() == 0
    with pytest.raises(Exception, match="no-such-limit"):
        await durable_chats(workflows=fleet("thaw", 1, 1), concurrency_limit="no-such-limit")
    assert gc.get_freeze_count() == 0


async def test_a_heap_someone_else_froze_stays_as_it_was(sim: Simulator, coder_env: Path) -> None:
    FREEZE_COUNTS.clear()
    gc.freeze()
    try:
        theirs = gc.get_freeze_count()
        await durable_chats(workflows=probing("theirs", 1, 2), tools=PROBE)
        # Not thawed, and not frozen again (the count would have risen).
        assert 0 < max(FREEZE_COUNTS) <= theirs
        assert 0 < gc.get_freeze_count() <= theirs
    finally:
        gc.unfreeze()


async def test_a_global_concurrency_limit_bounds_the_fleet(sim: Simulator, coder_env: Path) -> None:
    """Each workflow holds a slot of the limit from its first step to its archive, so
    no more chats are live at once than the limit allows."""
    name = f"coder-chats-{uuid.uuid4().hex[:6]}"
    async with get_client() as client:
        await client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=name, limit=3)
        )
    workflows = fleet("gated", 9, 2)
    results = await durable_chats(workflows=workflows, concurrency_limit=name)
    assert len(results) == 9
    spans: list[tuple[datetime, datetime]] = []
    for spec in workflows:
        [chat_id] = chat_of(sim, spec.workflow_id)
        [archived] = [a.at for a in sim.records.archives if a.chat_id == chat_id]
        spans.append((sim.chat(chat_id).created_at, archived))
    most = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert 1 <= most <= 3, spans


async def test_a_failed_workflow_is_ended_and_the_others_finish(
    sim: Simulator, coder_env: Path
) -> None:
    """A workflow whose turn fails for good (a config error) is archived and marked
    FAILED; the others finish, and the run fails naming it."""
    workflows = fleet("mixed", 3, 2)
    workflows[1].prompts[1] = "this one breaks /fail fatal"
    with pytest.raises(FleetFailed, match=r"1 of 3 workflow.*mixed-1"):
        await durable_chats(workflows=workflows)
    assert await stored_states(sim, coder_env, [w.workflow_id for w in workflows]) == {
        "mixed-0": WorkflowState.FINISHED,
        "mixed-1": WorkflowState.FAILED,
        "mixed-2": WorkflowState.FINISHED,
    }
    assert all(sim.chat(chat_of(sim, w.workflow_id)[0]).archived for w in workflows)


async def test_a_flow_of_its_own_runs_many_workflows_with_a_durable_fleet(
    sim: Simulator, coder_env: Path
) -> None:
    """``DurableFleet`` in a user's flow: each workflow decides its own turns as it goes,
    one fails alone (ended, the others finished), and the run fails naming it."""

    @flow(name="own-fleet")
    async def own_fleet(ids: list[str]) -> None:
        async with DurableFleet(ids) as fleet:

            async def decide(chat: DurableChat) -> None:
                first = await chat.turn(f"first for {chat.workflow_id}")
                if chat.workflow_id.endswith("-2"):
                    raise ValueError(f"{chat.workflow_id} did not like {first.text[:12]!r}")
                await chat.turn("second, since the first went well")

            await asyncio.gather(*(fleet.run(i, decide, expected_turns=2) for i in ids))

    ids = [f"own-fleet-{i}" for i in range(3)]
    with pytest.raises(FleetFailed, match=r"1 of 3 workflow.*own-fleet-2: own-fleet-2 did not"):
        await own_fleet(ids)
    assert await stored_states(sim, coder_env, ids) == {
        "own-fleet-0": WorkflowState.FINISHED,
        "own-fleet-1": WorkflowState.FINISHED,
        "own-fleet-2": WorkflowState.FAILED,
    }
    for i in ids:
        [chat_id] = chat_of(sim, i)
        assert sim.chat(chat_id).archived
        sent = [m for m in sim.messages(chat_id) if m.role == "user"]
        assert len(sent) == (1 if i.endswith("-2") else 2)


async def test_a_fleet_names_each_workflow_once_and_runs_only_its_own() -> None:
    """Two chats of one workflow in one run would take each other's epoch; a workflow the
    fleet was not given would be missing from its totals and its run's name."""
    with pytest.raises(CoderConfigError, match=r"repeated: \['twice'\]"):
        DurableFleet(["twice", "once", "twice"])

    async def nothing(chat: DurableChat) -> None:
        raise AssertionError("not run")

    with pytest.raises(CoderConfigError, match="'stranger' is not one of this fleet's"):
        await DurableFleet(["mine"]).run("stranger", nothing)
