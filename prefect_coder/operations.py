"""What a person does to a workflow from outside its runs: cancel it, resume it, or
archive its chat once it is over.

``prefect-coder workflows cancel|resume`` call these, and the ``archive-workflow`` flow the
last. Neither is a fault for the sweep to
repair: a cancelled workflow is never relaunched, and a resumed one is carried on from its
last finished step by a new run of its deployment (its finished steps come from the store
and are never sent again).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments.flow_runs import arun_deployment
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelling

from coder_chat import CoderConfigError
from coder_chat.durable.context import DurableOptions, StepTools
from coder_chat.durable.markers import LABEL_WORKFLOW, owner_labels
from coder_chat.durable.records import WorkflowRecord, WorkflowState
from coder_chat.durable.retire import Retired
from coder_chat.durable.store import DurableStore
from coder_chat.durable.sweep import end_cancelled
from prefect_coder._run.marks import note_on_run
from prefect_coder._run.naming import deployment_name, workflow_tag
from prefect_coder._run.runtime import Ledger, Runtime
from prefect_coder._run.workflow import Workflow, WorkflowRun, finish_workflow, take_epoch
from prefect_coder.blocks import CoderCredentials
from prefect_coder.imports import ToolLike, resolve_tools
from prefect_coder.settings import WorkflowSettings
from prefect_coder.tasks.lifecycle import archive_chat

__all__ = [
    "RESUMABLE",
    "Cancelled",
    "Runtime",
    "archive_workflow_chat",
    "cancel_workflow",
    "resume_workflow",
]

#: A workflow in one of these states can be resumed.
RESUMABLE = frozenset({WorkflowState.FAILED, WorkflowState.CANCELLED, WorkflowState.OVER_BUDGET})


@dataclass
class Cancelled:
    """What cancelling did: the workflow as it was, and what became of its chats."""

    workflow: WorkflowRecord
    chats: list[Retired]


async def cancel_workflow(
    rt: Runtime, workflow_id: str, tools: StepTools, report: Callable[[str], None]
) -> Cancelled:
    """End a running workflow for good: its flow run cancelled in Prefect (a worker kills
    its process), its turn stopped, its pause answered from the ledger (else "not run"),
    its chats archived, and the workflow stored cancelled. Works with its run gone too."""
    workflow = await _workflow(rt.store, rt.tenant, workflow_id)
    if workflow.state != WorkflowState.RUNNING:
        raise CoderConfigError(
            f"workflow {workflow_id!r} is {workflow.state}, not running: there is nothing to cancel"
        )
    if workflow.flow_run_id:
        await _cancel_flow_run(workflow.flow_run_id, report)
    labels = {
        **owner_labels(workflow.deployment, await rt.store.store_id()),
        LABEL_WORKFLOW: workflow_id[:256],
    }
    labelled = [chat.id async for chat in rt.client.iter_chats(labels=labels)]
    chats = await end_cancelled(
        rt.client, rt.store, workflow, labelled, tools, DurableOptions(), report
    )
    if workflow.flow_run_id:
        said = f"Workflow {workflow_id} was cancelled with `prefect-coder workflows cancel`."
        await note_on_run(workflow.flow_run_id, said, report)
    return Cancelled(workflow, chats)


async def _cancel_flow_run(flow_run_id: str, report: Callable[[str], None]) -> None:
    """Ask Prefect to cancel the run, as the UI's Cancel does, unless it already ended."""
    try:
        async with get_client() as client:
            run = await client.read_flow_run(UUID(flow_run_id))
            if run.state is not None and run.state.is_final():
                return
            await client.set_flow_run_state(run.id, Cancelling(), force=True)
        report(f"Its flow run {run.name!r} is being cancelled in Prefect.")
    except ObjectNotFound:
        return  # gone: nothing runs it
    except Exception as exc:  # noqa: BLE001 - the store's epoch stops the run all the same
        report(f"Could not cancel its flow run {flow_run_id} in Prefect ({exc}).")


async def resume_workflow(
    store: DurableStore,
    tenant: str,
    workflow_id: str,
    settings: Mapping[str, Any] | None = None,
) -> FlowRun:
    """Launch the workflow's deployment again, with its last run's parameters, to carry on
    a workflow that failed, was cancelled or went over budget, or one left running by a run
    that ended (the sweep gave up relaunching it), after its cause is fixed. ``settings``:
    fields of its ``WorkflowSettings`` to change from then on (a raised budget). Returns
    the new run.

    The store is not changed here: the new run takes the workflow over when it goes past
    its finished steps, and reopens its chat.
    """
    workflow = await _workflow(store, tenant, workflow_id)
    if workflow.state not in RESUMABLE and workflow.state != WorkflowState.RUNNING:
        raise CoderConfigError(
            f"workflow {workflow_id!r} is {workflow.state}: only a failed, cancelled or "
            "stranded workflow is resumed"
        )
    if not workflow.flow_run_id:
        raise CoderConfigError(
            f"workflow {workflow_id!r} has no flow run to resume from: run its flow again "
            "with the same workflow id"
        )
    async with get_client() as client:
        try:
            last = await client.read_flow_run(UUID(workflow.flow_run_id))
        except ObjectNotFound:
            raise CoderConfigError(
                f"the last flow run of workflow {workflow_id!r} ({workflow.flow_run_id}) is "
                "gone from Prefect: run its flow again with the same workflow id"
            ) from None
        if workflow.state == WorkflowState.RUNNING and not _ended(last):
            raise CoderConfigError(
                f"workflow {workflow_id!r} is running: its flow run {last.name!r} is "
                f"{last.state_name}; cancel it first to stop it"
            )
        if last.deployment_id is None:
            raise CoderConfigError(
                f"workflow {workflow_id!r} ran outside a deployment: run its flow again with "
                "the same workflow id (its finished steps come from the store)"
            )
        return await arun_deployment(
            last.deployment_id,
            client=client,
            parameters=_with_settings(workflow_id, last.parameters, settings or {}),
            tags=[workflow_tag(workflow_id), "prefect-coder:resume"],
            flow_run_name=f"{workflow_id} · resumed",
            timeout=0,
            as_subflow=False,
        )


def _with_settings(
    workflow_id: str, parameters: dict[str, Any], changes: Mapping[str, Any]
) -> dict[str, Any]:
    """The last run's parameters, with ``changes`` made to its ``settings``."""
    if not changes:
        return parameters
    if "settings" not in parameters:
        raise CoderConfigError(
            f"the flow of workflow {workflow_id!r} takes no 'settings' parameter: its budget "
            "cannot be raised on resume; run it again with the new settings instead"
        )
    given = parameters["settings"] or {}
    if not isinstance(given, dict):
        raise CoderConfigError(f"workflow {workflow_id!r}: its run's settings are not a mapping")
    return {**parameters, "settings": {**given, **changes}}


def _ended(run: FlowRun) -> bool:
    """Whether nothing runs the flow run any more (a workflow held by it is stranded, e.g.
    after its relaunches were refused for a changed prompt and the sweep gave up)."""
    return run.state is not None and run.state.is_final()


async def _workflow(store: DurableStore, tenant: str, workflow_id: str) -> WorkflowRecord:
    workflow = await store.get_workflow(tenant, workflow_id)
    if workflow is None:
        raise CoderConfigError(f"no workflow {workflow_id!r} in this store (tenant {tenant})")
    return workflow


async def archive_workflow_chat(
    workflow_id: str,
    tools: Sequence[ToolLike] = (),
    *,
    allow_plain_tools: bool = False,
    credentials: CoderCredentials | None = None,
    ledger: Ledger | None = None,
) -> bool:
    """Archive the chat of ``workflow_id`` (a paused client tool reconciled first, by the
    ``archive_chat`` task) and store the workflow finished. Its next epoch is taken first,
    so a run still acting for it is fenced out before its chat is archived. Returns whether
    a chat was archived."""
    workflow = Workflow(
        workflow_id,
        deployment=await deployment_name(),
        flow_run_id=None,
        credentials=credentials,
        ledger=ledger,
        settings=WorkflowSettings(allow_plain_tools=allow_plain_tools),
        tools=resolve_tools(tools, allow_plain=allow_plain_tools),
    )
    rt = Runtime.from_blocks(credentials, ledger)
    run = WorkflowRun(workflow, await take_epoch(rt, workflow), rt)
    archived = await archive_chat(run)
    await finish_workflow(run, WorkflowState.FINISHED)
    return archived
