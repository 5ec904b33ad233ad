"""``run_turn``: one step of a durable chat, as one Prefect task.

A step the store holds as finished comes back from the store; recovery comes
first whenever the checkpoint or journal says an earlier attempt may be in
flight; then the turn. The store is the record of progress; the result Prefect
persists (JSON, under a cache key of ids only) only saves the store read on a
machine that ran the step. Retries happen only for failures
:func:`coder_chat.is_retryable` calls transient, and each retry recovers first.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.context import TaskRunContext

from coder_chat import CoderConfigError
from coder_chat.durable.context import DurableOptions, StepContext, StepTools
from coder_chat.durable.records import Fence
from coder_chat.durable.step import StepResult, StepSpec, run_step

from ._runtime import connected, import_model, import_tools, retry_if_transient, step_cache_key


@task(
    name="run-turn",
    task_run_name="turn {workflow_id} step {step}",
    persist_result=True,
    result_serializer="json",
    cache_key_fn=step_cache_key,
    retries=2,
    retry_delay_seconds=[1, 5],
    retry_condition_fn=retry_if_transient,
)
async def run_turn(
    tenant: str,
    workflow_id: str,
    step: int,
    prompt: str,
    epoch: int,
    tools: list[str] | None = None,
    allow_plain_tools: bool = False,
    output_schema: str | None = None,
    system_prompt: str | None = None,
    model: str | None = None,
    workspace_id: str | None = None,
    mcp_server_ids: list[str] | None = None,
    deployment: str = "local",
    declare_structured_output: bool = False,
    credentials_block: str | None = None,
    ledger_block: str | None = None,
    options: DurableOptions | None = None,
) -> StepResult:
    """Run (or recover) step ``step`` of workflow ``workflow_id``."""
    log = get_run_logger()
    output_type = import_model(output_schema)
    step_tools = StepTools.build(
        import_tools(tools or []), allow_plain=allow_plain_tools, output_type=output_type
    )
    async with connected(credentials_block, ledger_block, log.debug) as (client, store, resolved):
        if resolved != tenant:
            raise CoderConfigError(f"credentials are for organization {resolved}, not {tenant}")
        fence = Fence(tenant=tenant, workflow_id=workflow_id, epoch=epoch)
        ctx = StepContext(
            client,
            store,
            fence,
            workflow_id,
            step,
            step_tools,
            options or DurableOptions(),
            log.info,
            first_try=epoch == 1 and _first_try(),
        )
        spec = StepSpec(
            prompt=prompt,
            output_type=output_type,
            system_prompt=system_prompt,
            model=model,
            workspace_id=workspace_id,
            mcp_server_ids=list(mcp_server_ids or []),
            deployment=deployment,
            declare_structured_output=declare_structured_output or output_type is not None,
        )
        result = await run_step(ctx, spec)
    log.info(f"Step {step}: {result.verdict} on chat {result.chat_id}.")
    return result


def _first_try() -> bool:
    """Whether this is the task run's first try (Prefect counts each try it runs)."""
    context = TaskRunContext.get()
    return context is not None and context.task_run.run_count <= 1
