"""Fleet schedules come from (seed, index) alone, and always leave the lab something to do."""

from __future__ import annotations

from tests.fleet.draw import derive
from tests.fleet.plan import HOST_FAULTS


def test_a_schedule_is_replayed_from_its_seed_and_index() -> None:
    assert derive(7, 3) == derive(7, 3)
    assert derive(7, 3) != derive(7, 4)


def test_every_schedule_has_three_workflows_and_faults_aimed_somewhere() -> None:
    for index in range(200):
        schedule = derive(11, index)
        assert len(schedule.workflows) == 3
        assert 2 <= len(schedule.faults) <= 3
        for fault in schedule.faults:
            assert (fault.kind in HOST_FAULTS) == bool(fault.target), fault
            assert (fault.kind in HOST_FAULTS) == (fault.end is not None), fault
        for workflow in schedule.workflows:
            assert 3 <= len(workflow.steps) <= 5
