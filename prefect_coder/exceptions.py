"""How a flow run learns that its workflow left it: raised out of ``DurableChat``."""

from __future__ import annotations

from prefect.exceptions import Abort

from coder_chat import CoderConfigError


class Superseded(Abort):
    """This flow run lost its workflow to a newer run: it does nothing more.

    Raised out of the flow once its run is marked *Cancelled: Superseded*, naming
    the run that replaced it; Prefect ends the run there without marking it failed.
    """


class WorkflowCancelled(Abort):
    """A person cancelled this flow run, and the sweep ended its workflow (chat archived,
    stored cancelled) while the run's process was still going: it does nothing more."""


class WorkflowOverBudget(Abort):
    """This flow run's workflow reached a limit (its budget's, or Coder's usage limit) and
    was ended for it (chat archived, stored over budget); the run is marked *Cancelled:
    Over budget*, saying which limit and how to carry it on."""


class StoreLost(Abort):
    """This flow run could not reach the durable store through every retry: it ends
    *Crashed*, not failed, and the workflow is left running for the orphan sweep to
    relaunch once the store is back."""


class WorkflowFinished(CoderConfigError):
    """A turn past the end of a workflow that finished and archived its chat."""
