"""``prune_ended_workflows``: delete the workflows that ended long ago, and say which.

With each workflow go its finished steps, its chats' journal rows and the tool ledger
entries of its chats, in one write of the store
(:meth:`~coder_chat.durable.store.DurableStore.prune_workflows`). A running workflow is
never taken, nor the sweep's own records. Pruning is idempotent, so the task retries
what :func:`~coder_chat.is_retryable` calls transient, like every task of ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from prefect.artifacts import acreate_table_artifact

from coder_chat import CoderConfigError
from coder_chat.durable.base import ENDED_STATES
from coder_chat.durable.records import WorkflowRecord
from coder_chat.durable.retention import prune_sentence
from coder_chat.settings import CoderSettings
from prefect_coder._run.logs import run_log
from prefect_coder._run.runtime import Ledger, checked_blocks
from prefect_coder._run.task_policy import durable_task
from prefect_coder.blocks import CoderCredentials, SqliteLedger

#: The key of the table artifact each run leaves (the latest run's is on top).
ARTIFACT_KEY = "prune-workflows"


@durable_task(
    name="prune-ended-workflows",
    task_run_name="prune workflows ended over {older_than_days} days ago",
)
async def prune_ended_workflows(
    older_than_days: float,
    states: Sequence[str] = tuple(str(s) for s in ENDED_STATES),
    deployment: str | None = None,
    dry_run: bool = False,
    organization_id: str = "",
    credentials: CoderCredentials | None = None,
    ledger: Ledger | None = None,
) -> list[str]:
    """Delete the workflows of the tenant that ended (in one of ``states``) more than
    ``older_than_days`` ago, of ``deployment`` when given; with ``dry_run`` only say which.
    Returns their ids."""
    if older_than_days < 0:
        raise CoderConfigError(f"older_than_days must be 0 or more (got {older_than_days})")
    credentials, ledger = checked_blocks(credentials, ledger)
    tenant = _tenant(organization_id, credentials)
    store = (ledger or SqliteLedger.default()).get_store()
    age = timedelta(days=older_than_days)
    ended_before = datetime.now(UTC) - age
    chosen = list(states) or [str(s) for s in ENDED_STATES]
    found = await store.list_prunable(
        tenant, ended_before=ended_before, states=chosen, deployment=deployment
    )
    if dry_run:
        removed = [w.workflow_id for w in found]
    else:
        removed = await store.prune_workflows(
            tenant, ended_before=ended_before, states=chosen, deployment=deployment
        )
    sentence = prune_sentence(removed, age, chosen, dry_run=dry_run)
    run_log().info(sentence)
    known = {w.workflow_id: w for w in found}
    await acreate_table_artifact(
        [_row(known.get(workflow_id), workflow_id, dry_run) for workflow_id in removed]
        or [{"workflow_id": "", "state": "", "deployment": "", "ended": "", "action": "nothing"}],
        key=ARTIFACT_KEY,
        description=sentence,
    )
    return removed


def _tenant(organization_id: str, credentials: CoderCredentials | None) -> str:
    """The tenant: the flow's parameter, the credentials block's, or ``CODER_ORG_ID``
    (pruning needs no Coder address or token)."""
    tenant = (
        organization_id
        or (credentials.organization_id if credentials else "")
        or CoderSettings().organization_id
    )
    if not tenant:
        raise CoderConfigError(
            "whose workflows? Set organization_id, the credentials' organization, or CODER_ORG_ID"
        )
    return tenant


def _row(workflow: WorkflowRecord | None, workflow_id: str, dry_run: bool) -> dict[str, str]:
    ended = workflow.updated_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if workflow else ""
    return {
        "workflow_id": workflow_id,
        "state": str(workflow.state) if workflow else "",
        "deployment": workflow.deployment if workflow else "",
        "ended": ended,
        "action": "would remove" if dry_run else "removed",
    }
