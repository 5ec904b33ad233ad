"""``run_turn``: one step of a durable chat, as one Prefect task.

A step the store holds as finished comes back from the store; recovery comes
first whenever the checkpoint or journal says an earlier attempt may be in
flight; then the turn. The store is the record of progress; the result Prefect
persists (JSON, under a cache key of ids only) only saves the store read on a
machine that ran the step. Retries happen only for failures
:func:`coder_chat.is_retryable` calls transient, and each retry recovers first.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefect import task
from prefect.context import TaskRunContext

from coder_chat import CoderConfigError
from coder_chat.durable.context import StepContext, StepTools
from coder_chat.durable.records import Fence
from coder_chat.durable.step import StepResult, StepSpec, run_step
from prefect_coder.blocks import CoderCredentials
from prefect_coder.tasks._runtime import (
    RETRY_DELAYS,
    Ledger,
    import_model,
    import_tools,
    retry_if_transient,
    run_log,
    runtime,
    step_cache_key,
)
from prefect_coder.tasks.settings import WorkflowSettings

#: What each verdict means, for the step's log line.
VERDICT_WORDS = {
    "ran": "sent once and answered",
    "recovered": "the crashed attempt had finished; its answer was read from the chat",
    "resubmitted": "the earlier attempt was cut short, so it was sent again",
    "stored": "finished in an earlier run; its answer came from the store",
    "cached": "finished in an earlier run; its answer came from Prefect's result cache",
}


@task(
    name="run-turn",
    task_run_name="{workflow_id} · step {step} of {steps}",
    persist_result=True,
    result_serializer="json",
    cache_key_fn=step_cache_key,
    retries=len(RETRY_DELAYS),
    retry_delay_seconds=RETRY_DELAYS,
    retry_condition_fn=retry_if_transient,
)
async def run_turn(
    tenant: str,
    workflow_id: str,
    step: int,
    steps: int,
    prompt: str,
    epoch: int,
    tools: Sequence[str] = (),
    output_schema: str = "",
    settings: WorkflowSettings | None = None,
    deployment: str = "local",
    declare_structured_output: bool = False,
    credentials: CoderCredentials | None = None,
    ledger: Ledger | None = None,
) -> StepResult:
    """Run (or recover) step ``step`` of workflow ``workflow_id``."""
    log = run_log()
    settings = settings or WorkflowSettings()
    output_type = import_model(output_schema)
    step_tools = StepTools.build(
        import_tools(tools), allow_plain=settings.allow_plain_tools, output_type=output_type
    )
    rt = runtime(credentials, ledger)
    if rt.tenant != tenant:
        raise CoderConfigError(f"credentials are for organization {rt.tenant}, not {tenant}")
    ctx = StepContext(
        rt.client,
        rt.store,
        Fence(tenant=tenant, workflow_id=workflow_id, epoch=epoch),
        workflow_id,
        step,
        step_tools,
        settings.options(),
        log.info,
        first_try=epoch == 1 and _first_try(),
    )
    spec = StepSpec(
        prompt=prompt,
        output_type=output_type,
        system_prompt=settings.system_prompt or None,
        model=settings.model or None,
        workspace_id=settings.workspace_id or None,
        mcp_server_ids=list(settings.mcp_server_ids),
        deployment=deployment,
        declare_structured_output=declare_structured_output or output_type is not None,
    )
    result = await run_step(ctx, spec)
    if result.verdict != "stored":  # a stored step said so already
        log.info(f"Step {step} of {steps}: {result.verdict} ({VERDICT_WORDS[result.verdict]}).")
    return result


def _first_try() -> bool:
    """Whether this is the task run's first try (Prefect counts each try it runs)."""
    context = TaskRunContext.get()
    return context is not None and context.task_run.run_count <= 1
