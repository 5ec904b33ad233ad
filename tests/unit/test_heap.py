"""``heap_frozen``: the heap a fleet found is frozen while fleets run, and thawed after."""

from __future__ import annotations

import gc

import pytest

from prefect_coder.tasks._heap import heap_frozen


def test_the_heap_is_frozen_until_the_last_fleet_ends() -> None:
    assert gc.get_freeze_count() == 0
    with heap_frozen():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with heap_frozen():  # a second fleet in the same process
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
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
            assert gc.get_freeze_count() == theirs
        assert gc.get_freeze_count() == theirs
    finally:
        gc.unfreeze()
