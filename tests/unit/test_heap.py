"""``heap_frozen``: the heap a fleet found is frozen while fleets run, and thawed after."""

from __future__ import annotations

import gc

import pytest

from prefect_coder._run.heap import heap_frozen


def still_frozen(count: int) -> bool:
    """Frozen as it was: not thawed, and not frozen again (which would add every object
    made since). A frozen object that is freed leaves the count, and the process's other
    threads (Prefect's services, left by earlier tests) may free some meanwhile."""
    return 0 < gc.get_freeze_count() <= count


def test_the_heap_is_frozen_until_the_last_fleet_ends() -> None:
    assert gc.get_freeze_count() == 0
    with heap_frozen():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with heap_frozen():  # a second fleet in the same process
            assert still_frozen(frozen)
        assert still_frozen(frozen)
    assert gc.get_freeze_count() == 0


def test_a_fleet_that_fails_still_thaws_the_heap() -> None:
    with pytest.raises(RuntimeError), heap_frozen():
        assert gc.get_freeze_count() > 0
        raise RuntimeError("a fleet failed")
    assert gc.get_freeze_count() == 0


def test_a_heap_someone_else_froze_stays_frozen() -> None:
    gc.freeze()
    try:
        theirs = gc.get_freeze_count()
        with heap_frozen():
            assert still_frozen(theirs)
        assert still_frozen(theirs)
    finally:
        gc.unfreeze()
