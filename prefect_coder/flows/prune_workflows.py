"""``prune_workflows``: clear out workflows that ended long ago.

Run it on a schedule (``deployments/prefect.yaml`` runs it once a day). It deletes the
workflows that ended (finished, failed, cancelled or over budget) more than ``older_than_days`` ago,
with their steps, chats' journal rows and tool ledger entries; a running workflow is
never touched. ``prefect-coder workflows prune`` does the same from a shell.
"""

from collections.abc import Sequence
from typing import Literal

from prefect import flow

from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.tasks.prune import prune_ended_workflows

EndedState = Literal["finished", "failed", "cancelled", "over-budget"]


@flow(name="prune-workflows")
async def prune_workflows(
    older_than_days: float = 30,
    states: Sequence[EndedState] = ("finished", "failed", "cancelled", "over-budget"),
    deployment: str | None = None,
    dry_run: bool = False,
    organization_id: str = "",
    credentials: CoderCredentials | None = None,
    ledger: SqliteLedger | PostgresLedger | None = None,
) -> list[str]:
    """Delete the workflows that ended more than ``older_than_days`` ago.

    Args:
        older_than_days: Keep workflows that ended more recently than this (days; 0.5 is
            12 hours).
        states: Which ended workflows to delete: finished, failed, cancelled, over-budget.
        deployment: Only the workflows of this durable-chat deployment (none: all).
        dry_run: Only report what would be deleted.
        organization_id: Whose workflows (empty: the credentials' organization, or
            CODER_ORG_ID).
        credentials: Saved Coder credentials, for their organization (none: the
            worker's environment). Pruning never calls Coder.
        ledger: The store to prune (none: the embedded SQLite store).

    Returns the ids of the workflows deleted (or that would be).
    """
    return await prune_ended_workflows(
        older_than_days,
        list(states),
        deployment,
        dry_run,
        organization_id,
        credentials,
        ledger,
    )
