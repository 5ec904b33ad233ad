"""The fence guard is the one place a run asks whether a newer epoch holds its workflow."""

from __future__ import annotations

import pytest

from coder_chat.durable.fence import FenceGuard
from coder_chat.durable.records import Fence
from coder_chat.durable.store import DurableStore, FencedOut

from .backends import T


async def test_a_run_taken_over_sees_the_newer_epoch_and_its_successor_holds(
    store: DurableStore,
) -> None:
    # fresh_for=0: every action reads (a confirmation is otherwise good for a second)
    first = FenceGuard(store, await store.begin_run(T, "wf", flow_run_id="run-1"), fresh_for=0)
    assert await first.holds() and await first.newer() is None
    second = FenceGuard(store, await store.begin_run(T, "wf", flow_run_id="run-2"))
    assert not await first.holds()
    newer = await first.newer()
    assert newer is not None and newer.epoch == 2 and newer.flow_run_id == "run-2"
    with pytest.raises(FencedOut):
        await first("send")
    assert await second.holds() and await second.newer() is None
    await second("send")  # confirmed by the read just before: no raise


async def test_a_workflow_gone_from_the_store_is_held_by_no_one(store: DurableStore) -> None:
    guard = FenceGuard(store, await store.begin_run(T, "wf"))
    other = FenceGuard(store, guard.fence.model_copy(update={"workflow_id": "never-begun"}))
    assert not await other.holds() and await other.newer() is None


async def test_every_read_that_finds_the_fence_holding_confirms_it(store: DurableStore) -> None:
    for ask in ("holds", "newer"):
        guard = FenceGuard(store, await store.begin_run(T, f"wf-{ask}"), fresh_for=60)
        assert not guard.fresh
        await getattr(guard, ask)()
        assert guard.fresh, ask  # the next action costs no read
    superseded = FenceGuard(store, await store.begin_run(T, "wf-taken"), fresh_for=60)
    await store.begin_run(T, "wf-taken")
    assert await superseded.newer() is not None and not superseded.fresh


def test_the_fencing_rule_holds_only_at_the_fences_own_epoch() -> None:
    fence = Fence(tenant=T, workflow_id="wf", epoch=3)
    assert fence.holds(3)
    assert not fence.holds(4) and not fence.holds(None)
