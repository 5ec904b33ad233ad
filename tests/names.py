"""The names a person reads in Prefect, as the docs give them.

Tests compare what a run shows with these, never with the package's own functions: a
change to what people read must fail a test, not follow it silently.
"""

from __future__ import annotations

#: The tag of a run refused because its code asks a step another prompt than it ran.
REFUSED = "prefect-coder:refused"
#: The event a live run sends every few seconds while it holds a workflow.
PULSE = "prefect-coder.flow-run.pulse"


def run_name(workflow_id: str, epoch: int) -> str:
    """A run that holds a workflow: ``trip-7 · epoch 2``."""
    return f"{workflow_id} · epoch {epoch}"


def replay_name(workflow_id: str) -> str:
    """A run of a workflow that had finished: it takes no epoch."""
    return f"{workflow_id} · already finished"


def workflow_tag(workflow_id: str) -> str:
    """The tag every flow run of a workflow carries."""
    return f"workflow:{workflow_id}"
