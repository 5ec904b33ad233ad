"""How a step reads for a person: its verdict in words, in the run's log and progress."""

from __future__ import annotations

from collections.abc import Sequence

from coder_chat.durable.step import (
    StepResult,
)
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
    """``Step 2 of 3: ran (sent once and answered).``; with the turn's story told, its time
    and reply too: ``… answered) in 3.2 s: "All tests pass."``."""
    said = f"{run.step_title(result.step)}: {result.verdict} ({VERDICT_WORDS[result.verdict]})"
    if not run.workflow.settings.tell_turns:
        return f"{said}."
    when = "" if took is None else f" in {took:.1f} s"
    return f"{said}{when}: {_quoted(result.text)}."


def _quoted(text: str, limit: int = 160) -> str:
    """The reply, shortened, in double quotes: Prefect shows the state's message in single
    ones (``Completed('Step 2: ran … "All tests pass."')``)."""
    flat = " ".join(text.split())
    return '"' + (flat if len(flat) <= limit else flat[: limit - 1] + "…") + '"'


def progress_line(result: StepResult) -> str:
    """``step 2: recovered (the crashed attempt had finished; …)``: a step in the progress."""
    why = "" if result.verdict == "ran" else f" ({VERDICT_WORDS[result.verdict]})"
    return f"step {result.step}: {result.verdict}{why}"


def tally(results: Sequence[StepResult]) -> str:
    """``3 step(s), 2 ran, 1 recovered``."""
    counts: dict[str, int] = {}
    for result in results:
        counts[result.verdict] = counts.get(result.verdict, 0) + 1
    return f"{len(results)} step(s), " + ", ".join(f"{n} {v}" for v, n in counts.items())
