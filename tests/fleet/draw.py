"""Deriving a fleet schedule from ``(seed, index)`` alone, so ``--seed S --only I`` replays it.

Three workflows of 3 to 5 random steps (the campaign's step kinds, with longer
sleeps so that faults land inside turns), mostly each on its own host's queue,
and 2 or 3 faults, most of them aimed at the host running a workflow right after
one of its steps finished. A cut is healed after a while or once the workflow's
successor has taken its epoch (so that the run it replaced comes back to a
workflow that is no longer its own).

In about half the schedules a person acts on one workflow, among those faults
(:class:`~.plan.Person`): cancels it then resumes it, or runs it again with a
changed prompt. The person is drawn from a stream of its own, so that adding
people left every schedule's workflows and faults as they were.
"""

from __future__ import annotations

from dataclasses import replace
from random import Random

from tests.lab.drawing import draw_step
from tests.lab.steps import StepKind

from .plan import (
    HOST_FAULTS,
    PERSON_KINDS,
    Fault,
    FaultKind,
    FleetSchedule,
    FleetWorkflow,
    Moment,
    Person,
    Shape,
)

STEP_WEIGHTS: dict[StepKind, float] = {
    "plain": 2,
    "tool": 2,
    "parallel": 1.5,
    "deltas": 1,
    "sleep": 2,
}
FAULT_WEIGHTS: dict[FaultKind, float] = {
    "kill-host": 3,
    "cut-host": 3,
    "cut-store": 2,
    "cut-coder": 2,
    "shape-coder": 1.5,
    "restart-store": 1.5,
    "restart-prefect": 1,
}
#: How long a sleep step sleeps, in seconds: long enough for a fault to land inside one.
SLEEP_RANGE = (1.0, 5.0)
#: The share of schedules where a person acts on one of the workflows.
PERSON_SHARE = 0.5


def derive(seed: int, index: int, workers: int = 3) -> FleetSchedule:
    rng = Random(f"fleet:{seed}:{index}")
    hosts = [f"w{n}" for n in range(1, workers + 1)]
    queues = rng.sample(hosts, k=len(hosts))
    workflows = tuple(
        draw_workflow(rng, f"fl-{seed}-{index}-{chr(97 + n)}", queues[n % len(queues)])
        for n in range(3)
    )
    # Each fault follows a workflow of its own: two faults on one host mostly collide.
    victims = rng.sample(workflows, k=rng.randint(2, 3))
    faults = tuple(draw_fault(rng, victim, hosts) for victim in victims)
    workflows = with_person(Random(f"fleet:{seed}:{index}:person"), workflows, hosts)
    return FleetSchedule(seed, index, workflows, faults)


def with_person(
    rng: Random, workflows: tuple[FleetWorkflow, ...], hosts: list[str]
) -> tuple[FleetWorkflow, ...]:
    """The workflows, one of them with what a person does to it (in about half the
    schedules). The person acts once a step is finished, and before the last one: so
    the first prompt is stored (a changed one is refused for it) and there is
    something left to cancel."""
    if rng.random() >= PERSON_SHARE:
        return workflows
    chosen = rng.randrange(len(workflows))
    workflow = workflows[chosen]
    # Right after a step followed by a long one (when there is one), so that the person
    # mostly meets the workflow running: its other steps take a fraction of a second.
    steps = range(1, len(workflow.steps))
    long_next = [n for n in steps if workflow.steps[n].kind == "sleep"]
    at = Moment(
        "step",
        round(rng.uniform(0.0, 0.8), 1),
        workflow.workflow_id,
        rng.choice(long_next or list(steps)),
    )
    person = Person(rng.choice(PERSON_KINDS), at, rng.choice([*hosts, "default"]))
    return tuple(replace(w, person=person) if n == chosen else w for n, w in enumerate(workflows))


def draw_workflow(rng: Random, workflow_id: str, queue: str) -> FleetWorkflow:
    kinds = rng.choices(
        list(STEP_WEIGHTS), weights=list(STEP_WEIGHTS.values()), k=rng.randint(3, 5)
    )
    amounts = iter(rng.sample(range(100, 100_000), k=2 * len(kinds)))
    steps = tuple(draw_step(rng, kind, amounts, SLEEP_RANGE) for kind in kinds)
    chosen = queue if rng.random() < 0.7 else "default"
    return FleetWorkflow(workflow_id, steps, chosen, round(rng.uniform(0.0, 8.0), 1))


def draw_fault(rng: Random, victim: FleetWorkflow, hosts: list[str]) -> Fault:
    kind = rng.choices(list(FAULT_WEIGHTS), weights=list(FAULT_WEIGHTS.values()))[0]
    if rng.random() < 0.6:
        start = Moment(
            "step",
            round(rng.uniform(0.0, 3.0), 1),
            victim.workflow_id,
            rng.randint(1, len(victim.steps) - 1),
        )
    else:
        # Workflows launch within 8 s and take 10 to 20 s to start on two cores.
        start = Moment("time", round(rng.uniform(20.0, 60.0), 1))
    if kind not in HOST_FAULTS:
        return Fault(kind, start)
    target = f"running:{victim.workflow_id}" if rng.random() < 0.8 else rng.choice(hosts)
    return Fault(
        kind,
        start,
        target,
        _end(rng, kind, victim),
        how=rng.choice(("silent", "refused")),
        shape=_shape(rng) if kind == "shape-coder" else None,
    )


def _end(rng: Random, kind: FaultKind, victim: FleetWorkflow) -> Moment:
    if kind in ("cut-host", "cut-store") and rng.random() < 0.5:
        return Moment("epoch", round(rng.uniform(0.0, 8.0), 1), victim.workflow_id, 0)
    low, high = {
        "kill-host": (10.0, 40.0),
        "cut-host": (5.0, 60.0),
        "cut-store": (5.0, 60.0),
        "cut-coder": (5.0, 30.0),
        "shape-coder": (10.0, 40.0),
    }[kind]
    return Moment("time", round(rng.uniform(low, high), 1))


def _shape(rng: Random) -> Shape:
    return Shape(
        rate_kbit=rng.choice((16, 32, 64)),
        queue_packets=rng.randint(2, 6),
        delay=round(rng.uniform(0.05, 0.4), 2),
    )
