"""Drawing one step of a workflow, and the steps' prompts, alike for the campaign and the fleet.

A step's prompt carries the simulator's directive for what its turn does (a client tool
call, two in parallel, streamed deltas, a sleep, a structured answer); the labs choose
which kinds to draw and how long a sleep may be, the prompts are written here once.
"""

from __future__ import annotations

from collections.abc import Iterator
from random import Random

from .steps import Step, StepKind, prompt_json

WORDS = ("refund", "invoice", "ledger", "audit", "payout", "dispute", "receipt", "quote")
#: How long a drawn sleep step sleeps, in seconds, unless the lab says otherwise.
SLEEP_RANGE = (0.2, 2.0)


def charge_directive(amount: int) -> str:
    return f"/tool charge_card {prompt_json({'amount_cents': amount})}"


def plain_step(word: str) -> Step:
    return Step("plain", f"plan the {word}")


def charge_step(word: str, amount: int) -> Step:
    return Step("tool", f"charge the card for {word} {charge_directive(amount)}", (amount,))


def sleep_step(word: str, seconds: str) -> Step:
    return Step("sleep", f"think the {word} over /sleep {seconds}")


def draw_step(
    rng: Random,
    kind: StepKind,
    amounts: Iterator[int],
    sleep_range: tuple[float, float] = SLEEP_RANGE,
) -> Step:
    word = f"{rng.choice(WORDS)}-{rng.randint(1, 999)}"
    if kind == "tool":
        return charge_step(word, next(amounts))
    if kind == "parallel":
        a, b = next(amounts), next(amounts)
        prompt = f"charge both cards for {word} {charge_directive(a)} {charge_directive(b)}"
        return Step(kind, prompt, (a, b))
    if kind == "deltas":
        return Step(kind, f"stream the {word} summary /deltas {rng.randint(8, 64)}")
    if kind == "sleep":
        return sleep_step(word, f"{rng.uniform(*sleep_range):.1f}")
    if kind == "json":
        answer = {"verdict": word, "score": round(rng.uniform(0, 1), 2)}
        return Step(kind, f"file the {word} verdict /json {prompt_json(answer)}", (), answer)
    return plain_step(word)
