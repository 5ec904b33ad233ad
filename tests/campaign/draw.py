"""Deriving a schedule from ``(seed, index)`` alone, so ``--seed S --only I`` replays it.

The variant comes from its own random streams (first whether the schedule runs the
README's refund flow, a share of them; else which ``durable_chat`` variant), and
everything else is drawn for every variant alike (a second workflow, Postgres
restart times) and kept only where the variant uses it: a schedule replayed with
``--variant V`` is the same schedule whatever other variants the first campaign
allowed. A refund schedule draws from a stream of its own.

A person's action (a changed prompt, a cancel then a resume) is drawn for each
``durable_chat`` workflow from a stream of its own too, so adding it left every other
draw of a seed as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from random import Random
from typing import Any

from tests.lab.drawing import draw_step
from tests.lab.steps import (
    VARIANTS,
    Kill,
    Knob,
    Person,
    PgRestart,
    RefundCase,
    Schedule,
    Step,
    StepKind,
    Variant,
    WorkflowPlan,
)

from .refunds import draw_case, draw_refund_kill, steps_of

STEP_WEIGHTS: dict[StepKind, float] = {
    "plain": 2,
    "tool": 2,
    "parallel": 1.5,
    "deltas": 1,
    "sleep": 1,
    "json": 1,
}
#: Routes a transient 5xx/429 may hit, a cut may sever, a delayed commit may slow.
FAIL_ROUTES = (
    "create_chat",
    "send_message",
    "get_messages",
    "get_chat",
    "tool_results",
    "interrupt",
    "stream",
    "list_chats",
    "update_chat",
)
CUT_ROUTES = (
    "create_chat",
    "send_message",
    "tool_results",
    "get_messages",
    "get_chat",
    "interrupt",
    "update_chat",
)
#: A delayed create that lands after its process died leaves an orphan with the step's
#: marker and no journal entry to attribute it; sends and tool results are journaled.
DELAY_ROUTES = ("send_message", "tool_results")
STATUSES = (500, 502, 503, 504, 429)
DOUBLE_CRASH = 0.25
#: The share of schedules that run the README's refund flow (when that variant is allowed).
REFUND_SHARE = 0.2
#: A refund's failed or cut send would keep the example's 300 s commit horizon (it takes
#: no settings): its relaunch would wait five minutes. Its knobs leave sends alone.
REFUND_FAIL_ROUTES = tuple(r for r in FAIL_ROUTES if r != "send_message")
REFUND_CUT_ROUTES = tuple(r for r in CUT_ROUTES if r != "send_message")
#: The shares of ``durable_chat`` workflows where a person, after a kill, runs the workflow
#: again with a changed prompt, or cancels it (the next planned run resumes it).
CHANGED_PROMPT_SHARE = 0.15
CANCEL_SHARE = 0.15
#: Requests the knobs of one schedule may fail in all: a task makes 3 attempts (2 retries),
#: and more failures than that in a row exhaust them by design, not by a bug.
FAILURE_BUDGET = 2


def derive(seed: int, index: int, variants: Sequence[Variant] = VARIANTS) -> Schedule:
    variant = draw_variant(seed, index, variants)
    if variant == "refund":
        return draw_refund_schedule(seed, index)
    rng = Random(f"{seed}:{index}")
    first = draw_workflow(rng, f"wf-{seed}-{index}-a")
    second = draw_workflow(rng, f"wf-{seed}-{index}-b")
    knobs = draw_knobs(rng, len(first.steps))
    restarts = tuple(sorted(draw_restart(rng, first) for _ in range(rng.randint(1, 2))))
    first, second = (with_person(seed, index, plan) for plan in (first, second))
    return Schedule(
        seed,
        index,
        variant,
        (first, second) if variant == "concurrent" else (first,),
        knobs,
        restarts if variant == "postgres" else (),
    )


def draw_variant(seed: int, index: int, variants: Sequence[Variant]) -> Variant:
    others = sorted(v for v in variants if v != "refund")
    if "refund" in variants and (
        not others or Random(f"{seed}:{index}:flow").random() < REFUND_SHARE
    ):
        return "refund"
    return Random(f"{seed}:{index}:variant").choice(others)


def draw_refund_schedule(seed: int, index: int) -> Schedule:
    """The README's refund flow: a random amount and answer, one or two kills, knobs."""
    rng = Random(f"{seed}:{index}:refund")
    case = draw_case(rng, f"{seed}-{index}")
    kills = [draw_refund_kill(rng, case, run=1)]
    if rng.random() < DOUBLE_CRASH:
        kills.append(draw_refund_kill(rng, case, run=2))
    plan = refund_plan(case, tuple(kills))
    knobs = draw_knobs(rng, len(plan.steps), REFUND_FAIL_ROUTES, REFUND_CUT_ROUTES)
    return Schedule(seed, index, "refund", (plan,), knobs)


def refund_plan(case: RefundCase, kills: tuple[Kill, ...]) -> WorkflowPlan:
    return WorkflowPlan(case.workflow_id, steps_of(case), kills, refund=case)


# -- steps ---------------------------------------------------------------------------------------


def draw_workflow(rng: Random, workflow_id: str) -> WorkflowPlan:
    kinds = rng.choices(
        list(STEP_WEIGHTS), weights=list(STEP_WEIGHTS.values()), k=rng.randint(3, 5)
    )
    # Distinct amounts across the workflow: a logical call is (step, arguments).
    amounts = iter(rng.sample(range(100, 100_000), k=2 * len(kinds)))
    steps = tuple(draw_step(rng, kind, amounts) for kind in kinds)
    kills = [draw_kill(rng, steps, run=1)]
    if rng.random() < DOUBLE_CRASH:
        kills.append(draw_kill(rng, steps, run=2))
    return WorkflowPlan(workflow_id, steps, tuple(kills))


# -- kills ---------------------------------------------------------------------------------------


def draw_kill(rng: Random, steps: Sequence[Step], run: int) -> Kill:
    charges = sum(len(s.amounts) for s in steps)
    kinds = ["moment", "after-prompt", "in-tool", "held-send"]
    weights = [0.15, 0.45, 0.3 if charges else 0.0, 0.1 if len(steps) > 1 else 0.0]
    kind = rng.choices(kinds, weights=weights)[0]
    if kind == "moment":
        return Kill("moment", delay=round(rng.uniform(0.0, 4.0), 2))
    if kind == "in-tool":
        nth = rng.randint(1, charges if run == 1 else min(charges, 2))
        return Kill("in-tool", nth=nth, phase=rng.choice(("before", "after")))
    if kind == "held-send":
        # The first run's first prompt is the create; a later run's chat exists already.
        nth = rng.randint(1, len(steps) - 1) if run == 1 else rng.randint(0, 1)
        return Kill("held-send", nth=nth)
    top = len(steps) if run == 1 else 2
    return Kill("after-prompt", nth=rng.randint(1, top), delay=round(rng.uniform(0.0, 1.5), 2))


def with_person(seed: int, index: int, plan: WorkflowPlan) -> WorkflowPlan:
    """The plan with what a person does to it, if anything (its own random stream)."""
    person = draw_person(Random(f"{seed}:{index}:{plan.workflow_id}:person"), plan.kills)
    return replace(plan, person=person) if person is not None else plan


def draw_person(rng: Random, kills: Sequence[Kill]) -> Person | None:
    """A changed prompt after the last kill (most steps are finished by then), or a cancel
    after any; never after a held send, which lands late, while the person acts."""
    share = rng.random()
    after = [number for number, kill in enumerate(kills, start=1) if kill.kind != "held-send"]
    if not after or share >= CHANGED_PROMPT_SHARE + CANCEL_SHARE:
        return None
    if share < CHANGED_PROMPT_SHARE:
        return Person("changed-prompt", after[-1])
    return Person("cancel-resume", rng.choice(after))


def draw_restart(rng: Random, plan: WorkflowPlan) -> PgRestart:
    return PgRestart(rng.randint(1, len(plan.kills) + 1), round(rng.uniform(0.0, 3.0), 2))


# -- knobs ---------------------------------------------------------------------------------------


def draw_knob_count(rng: Random) -> int:
    return rng.choices([0, 1, 2, 3], weights=[0.2, 0.35, 0.3, 0.15])[0]


def draw_knobs(
    rng: Random,
    steps: int,
    fail_routes: Sequence[str] = FAIL_ROUTES,
    cut_routes: Sequence[str] = CUT_ROUTES,
) -> tuple[Knob, ...]:
    """0 to 3 knobs whose failed requests, all together, stay within one task's retries."""
    knobs, budget = [], FAILURE_BUDGET
    for _ in range(draw_knob_count(rng)):
        knob = draw_knob(rng, steps, budget, fail_routes, cut_routes)
        budget -= failures(knob)
        knobs.append(knob)
    return tuple(knobs)


def failures(knob: Knob) -> int:
    """Requests a knob makes fail outright (a task retry each, at worst)."""
    return int(knob.payload.get("count", 1)) if knob.kind in ("fail", "cut") else 0


def draw_knob(
    rng: Random,
    steps: int,
    budget: int = FAILURE_BUDGET,
    fail_routes: Sequence[str] = FAIL_ROUTES,
    cut_routes: Sequence[str] = CUT_ROUTES,
) -> Knob:
    """A transient fault within what the durable contract promises to survive."""
    kinds = ["delay", "stream-drop", "withhold-action", "retry-generation", "deadline"]
    kind = rng.choice(["fail", "cut", *kinds] if budget > 0 else kinds)
    after = rng.randint(0, steps - 1)
    body: dict[str, Any]
    if kind == "fail":
        body = {
            "route": rng.choice(fail_routes),
            "status": rng.choice(STATUSES),
            "count": rng.randint(1, min(2, budget)),
        }
    elif kind == "cut":
        body = {"route": rng.choice(cut_routes), "phase": rng.choice(("before", "after"))}
    elif kind == "delay":
        body = {"route": rng.choice(DELAY_ROUTES), "seconds": round(rng.uniform(0.2, 2.0), 2)}
    elif kind == "stream-drop":
        body = {"after_events": rng.randint(1, 8), "times": rng.randint(1, 2)}
    elif kind == "withhold-action":
        body = {"times": 1}
    elif kind == "retry-generation":
        body = {"times": rng.randint(1, 2)}
    else:
        # The server answers a paused client tool "timed out" after this long and the
        # model calls it again (era C): recovery after a kill often comes later.
        body = {"tool_result_deadline": round(rng.uniform(2.0, 5.0), 1)}
    return Knob(kind, tuple(sorted(body.items())), after)
