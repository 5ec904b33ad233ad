"""Schedules come from (seed, index) alone, and a replay with ``--variant`` is the same schedule."""

from __future__ import annotations

from .draw import FAILURE_BUDGET, derive, failures
from .plan import VARIANTS


def test_a_schedule_is_a_function_of_seed_and_index() -> None:
    assert [derive(7, i) for i in range(30)] == [derive(7, i) for i in range(30)]
    assert derive(7, 3) != derive(8, 3)


def test_a_replay_with_its_variant_is_the_same_schedule() -> None:
    for index in range(30):
        drawn = derive(11, index)
        assert derive(11, index, [drawn.variant]) == drawn


def test_schedules_keep_to_the_spec() -> None:
    schedules = [derive(3, i) for i in range(300)]
    assert {s.variant for s in schedules} == set(VARIANTS)
    for schedule in schedules:
        assert 0 <= len(schedule.knobs) <= 3
        assert len(schedule.workflows) == (2 if schedule.variant == "concurrent" else 1)
        assert bool(schedule.pg_restarts) == (schedule.variant == "postgres")
        for plan in schedule.workflows:
            assert 3 <= len(plan.steps) <= 5 and 1 <= len(plan.kills) <= 2
            for step in plan.steps:
                # Calls of one tool with identical arguments in one step are one call.
                assert len(set(step.amounts)) == len(step.amounts)


def test_the_knobs_of_a_schedule_fail_no_more_requests_than_a_task_retries() -> None:
    for index in range(300):
        knobs = derive(5, index).knobs
        assert sum(failures(k) for k in knobs) <= FAILURE_BUDGET, knobs
