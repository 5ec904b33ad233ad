"""How a step reads for a person: its verdict in words, in the run's log and progress."""

from __future__ import annotations

from collections.abc import Sequence

from coder_chat.durable.records import AfterSteps
from coder_chat.durable.step import (
    StepResult,
)
from coder_chat.protocol.usage import UsageTotals
from prefect_coder._run.workflow import WorkflowRun

#: What each verdict means, for the step's log line.
VERDICT_WORDS = {
    "ran": "sent once and answered",
    "recovered": "the crashed attempt had finished; its answer was read from the chat",
    "resubmitted": "the earlier attempt was cut short, so it was sent again",
    "stored": "finished in an earlier run; its answer came from the store",
    "cached": "finished in an earlier run; its answer came from Prefect's result cache",
}


def step_line(run: WorkflowRun, result: StepResult, took: float | None = None) -> str:
    """``Step 2 of 3: ran (sent once and answered), 1,234 tokens (…).``; with the turn's
    story told, its time and reply too: ``… answered) in 3.2 s, 1,234 tokens (…): "All
    tests pass."``."""
    said = f"{run.step_title(result.step)}: {result.verdict} ({VERDICT_WORDS[result.verdict]})"
    used = f", {result.usage.describe()}" if result.usage.messages else ""
    if not run.workflow.settings.tell_turns:
        return f"{said}{used}."
    when = "" if took is None else f" in {took:.1f} s"
    return f"{said}{when}{used}: {_quoted(result.text)}."


def _quoted(text: str, limit: int = 160) -> str:
    """The reply, shortened, in double quotes: Prefect shows the state's message in single
    ones (``Completed('Step 2: ran … "All tests pass."')``)."""
    flat = " ".join(text.split())
    return '"' + (flat if len(flat) <= limit else flat[: limit - 1] + "…") + '"'


def progress_line(result: StepResult) -> str:
    """``step 2: recovered (the crashed attempt had finished; …)``: a step in the progress."""
    why = "" if result.verdict == "ran" else f" ({VERDICT_WORDS[result.verdict]})"
    used = f"; {result.usage.brief()}" if result.usage.messages else ""
    return f"step {result.step}: {result.verdict}{why}{used}"


def tally(results: Sequence[StepResult], after_steps: AfterSteps | None = None) -> str:
    """``3 step(s), 2 ran, 1 recovered; it used 3,456 tokens (…)``."""
    counts: dict[str, int] = {}
    for result in results:
        counts[result.verdict] = counts.get(result.verdict, 0) + 1
    said = f"{len(results)} step(s), " + ", ".join(f"{n} {v}" for v, n in counts.items())
    used = workflow_usage(results, after_steps)
    return f"{said}; it used {used.describe()}" if used.messages else said


def workflow_usage(
    results: Sequence[StepResult], after_steps: AfterSteps | None = None
) -> UsageTotals:
    """What the steps consumed together, with what the chat ran after the last of them."""
    total = sum((r.usage for r in results), UsageTotals())
    return total + after_steps.usage if after_steps is not None else total
