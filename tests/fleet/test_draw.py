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


def test_about_half_the_schedules_have_a_person_acting_mid_workflow() -> None:
    people = [
        (w, w.person)
        for index in range(200)
        for w in derive(13, index).workflows
        if w.person is not None
    ]
    assert 70 <= len(people) <= 130, len(people)
    assert {p.kind for _, p in people} == {"cancel-resume", "changed-prompt"}
    for workflow, person in people:
        # After a step is stored (a changed first prompt is refused for it), before the last.
        assert person.at.kind == "step" and person.at.workflow_id == workflow.workflow_id
        assert 1 <= person.at.number < len(workflow.steps)
        assert person.queue in ("w1", "w2", "w3", "default")
        assert workflow.changed_prompts[1:] == workflow.prompts[1:]
        assert workflow.changed_prompts[0] != workflow.prompts[0]
