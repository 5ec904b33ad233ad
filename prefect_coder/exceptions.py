"""How a flow run learns that its workflow left it: raised out of ``DurableChat``."""

from __future__ import annotations

from typing import Any

from prefect.client.schemas.objects import State
from prefect.exceptions import Abort

from coder_chat import CoderConfigError


class RunEnded(Abort):
    """The flow run was ended, its final state set through Prefect's API, before this was
    raised out of the flow. That state goes with it (``state``), so that Prefect reports it
    as the run's end (else its last words are "Finished in state Running()")."""

    def __init__(self, message: str, state: State[Any] | None = None) -> None:
        super().__init__(message)
        if state is not None:
            self.state = state


class Superseded(RunEnded):
    """This flow run lost its workflow to a newer run: it does nothing more.

    Raised out of the flow once its run is marked *Cancelled: Superseded*, naming
    the run that replaced it; Prefect ends the run there without marking it failed.
    """


class WorkflowCancelled(RunEnded):
    """A person cancelled this flow run, and the sweep ended its workflow (chat archived,
    stored cancelled) while the run's process was still going: it does nothing more."""


class WorkflowOverBudget(RunEnded):
    """This flow run's workflow reached a limit (its budget's, or Coder's usage limit) and
    was ended for it (chat archived, stored over budget); the run is marked *Cancelled:
    Over budget*, saying which limit and how to carry it on."""


class StoreLost(RunEnded):
    """This flow run could not reach the durable store through every retry: it ends
    *Crashed*, not failed, and the workflow is left running for the orphan sweep to
    relaunch once the store is back."""


class WorkflowFinished(CoderConfigError):
    """A turn past the end of a workflow that finished and archived its chat."""
