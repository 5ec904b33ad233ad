"""Schedules come from (seed, index) alone, and a replay with ``--variant`` is the same schedule."""

from __future__ import annotations

from tests.lab.steps import PERSON_KINDS, VARIANTS, Variant

from .ci_slice import INDEXES as CI_INDEXES
from .ci_slice import SEED as CI_SEED
from .draw import FAILURE_BUDGET, derive, failures


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
            assert (plan.refund is not None) == (schedule.variant == "refund")
            steps = (2, 2) if plan.refund else (3, 5)
            assert steps[0] <= len(plan.steps) <= steps[1] and 1 <= len(plan.kills) <= 2
            for step in plan.steps:
                # Calls of one tool with identical arguments in one step are one call.
                assert len(set(step.amounts)) == len(step.amounts)


def test_a_share_of_schedules_runs_the_refund_flow_and_the_rest_are_drawn_as_before() -> None:
    """Adding the refund variant left every other schedule of a seed as it was drawn:
    the variant among the others comes from the same stream, over the same list."""
    schedules = [derive(3, i) for i in range(300)]
    refunds = [s for s in schedules if s.variant == "refund"]
    assert 0.1 < len(refunds) / len(schedules) < 0.3
    others: list[Variant] = [v for v in VARIANTS if v != "refund"]
    for schedule in schedules:
        if schedule.variant != "refund":
            assert derive(3, schedule.index, others) == schedule


def test_refund_schedules_ask_a_person_and_kill_only_where_the_flow_goes() -> None:
    for index in range(300):
        schedule = derive(9, index, ["refund"])
        (plan,) = schedule.workflows
        case = plan.refund
        assert case is not None and plan.workflow_id == case.workflow_id
        assert [s.kind for s in plan.steps] == ["json", "tool" if case.refunds else "plain"]
        kinds = {k.kind for k in plan.kills}
        assert "held-send" not in kinds
        assert case.asks or "paused" not in kinds
        assert case.refunds or "in-tool" not in kinds
        for knob in schedule.knobs:  # a failed send would keep the example's 300 s horizon
            assert not (knob.kind in ("fail", "cut") and knob.payload["route"] == "send_message")


def test_the_knobs_of_a_schedule_fail_no_more_requests_than_a_task_retries() -> None:
    for index in range(300):
        knobs = derive(5, index).knobs
        assert sum(failures(k) for k in knobs) <= FAILURE_BUDGET, knobs


def test_a_person_acts_on_some_workflows_after_a_kill_and_never_after_a_held_send() -> None:
    plans = [p for i in range(300) for p in derive(13, i).workflows if p.refund is None]
    drawn = [p for p in plans if p.person is not None]
    assert 0.2 < len(drawn) / len(plans) < 0.4
    assert {p.person.kind for p in drawn if p.person} == set(PERSON_KINDS)
    for plan in drawn:
        assert plan.person is not None and 1 <= plan.person.after_run <= len(plan.kills)
        assert plan.kills[plan.person.after_run - 1].kind != "held-send"
        assert plan.changed_prompts[0] != plan.prompts[0]
        assert plan.changed_prompts[1:] == plan.prompts[1:]
        assert plan.person.describe() in plan.describe()


def test_the_ci_slice_draws_each_persons_action() -> None:
    """tests/campaign/test_campaign.py's schedules include a changed prompt after a kill
    late in its run (its first step is finished by then) and a cancel then a resume."""
    people = [
        p.person for i in CI_INDEXES for p in derive(CI_SEED, i).workflows if p.person is not None
    ]
    assert {p.kind for p in people} == set(PERSON_KINDS), people
