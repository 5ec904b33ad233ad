"""``run_turn`` and ``reconcile_chat``: one step of a durable chat, as one Prefect task each.

A step the store holds as finished comes back from the store; recovery comes
first whenever the checkpoint or journal says an earlier attempt may be in
flight; then the turn. The store is the record of progress; the result Prefect
persists (JSON, under a cache key of ids only) only saves the store read on a
machine that ran the step. Retries happen only for failures
:func:`coder_chat.is_retryable` calls transient, and each retry recovers first.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from prefect.client.schemas.objects import State
from prefect.context import TaskRunContext
from prefect.states import Completed
from pydantic import BaseModel

from coder_chat.durable.step import StepResult, StepSpec, recover, run_step
from prefect_coder._run.logs import run_log, story_log
from prefect_coder._run.naming import slug
from prefect_coder._run.story import step_line
from prefect_coder._run.task_policy import durable_task
from prefect_coder._run.workflow import WorkflowRun


def step_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """Prefect's cache key of ``run_turn``: :func:`step_key` of its run's ids."""
    run: WorkflowRun = parameters["run"]
    return step_key(
        run.fence.tenant, run.workflow_id, parameters["step"], str(parameters["prompt"])
    )


def step_key(tenant: str, workflow_id: str, step: int, prompt: str) -> str:
    """Ids only (tenant, workflow, step, the prompt), never the inputs hashed whole: a
    re-run of the same workflow on this machine skips its finished steps.

    One flat file name (``prefect-coder-trip-7-step-2-…``): the key names the result's
    file, and a key with slashes made a directory per workflow and step, one ``mkdir``
    and one more path component to resolve on every result written or looked up. The
    workflow id is in it for a person to read (ASCII, at most 60 characters, so that the
    name fits any file system); the digest of all the ids tells keys apart.
    """
    digest = hashlib.sha256(json.dumps([tenant, workflow_id, step, prompt]).encode()).hexdigest()
    return f"prefect-coder-{slug(workflow_id)[:60]}-step-{step}-{digest[:24]}"


@durable_task(
    name="run-turn",
    task_run_name="{run.workflow_id} · step {step}{run.of_turns}",
    cache_key_fn=step_cache_key,
)
async def run_turn(
    run: WorkflowRun, step: int, prompt: str, output: type[BaseModel] | None = None
) -> State[StepResult]:
    """Run (or recover) step ``step`` of ``run``'s workflow.

    Its verdict is the message of the Completed state it ends in, so that Prefect's own
    last line of the task run says it (``Finished in state Completed('Step 2 of 3: ran
    (sent once and answered).')``), and the UI shows it with the state: one line a step
    where a line of our own would make two (each line costs about a millisecond in
    Prefect's console and API handlers, as much as the durable layer's store work).
    """
    log, started = run_log(), time.monotonic()
    first_try = run.fence.epoch == 1 and _first_try()
    tell = story_log().info if run.workflow.settings.tell_turns else None
    ctx = run.step_context(step, log.info, first_try=first_try, tell=tell)
    result = await run_step(ctx, StepSpec(prompt=prompt, output_type=output))
    # A stored step said so already, in the line that says where its answer came from.
    took = time.monotonic() - started
    message = None if result.verdict == "stored" else step_line(run, result, took)
    return Completed(data=result, message=message)


def _first_try() -> bool:
    """Whether this is the task run's first try (Prefect counts each try it runs)."""
    context = TaskRunContext.get()
    return context is not None and context.task_run.run_count <= 1


@durable_task(name="reconcile-chat", task_run_name="reconcile {run.workflow_id} step {step}")
async def reconcile_chat(run: WorkflowRun, step: int, output: type[BaseModel] | None = None) -> str:
    """Settle the workflow's chat and say whether step ``step`` finished (never resubmits).

    Returns ``"recovered"`` (the attempt finished; its result is in history),
    ``"unfinished"`` (a re-run would resubmit) or ``"no-chat"``.
    """
    log = run_log()
    store = run.runtime.store
    workflow = await store.get_workflow(run.fence.tenant, run.workflow_id)
    if workflow is None or workflow.chat_id is None:
        log.info(f"Workflow {run.workflow_id} has no chat; nothing to reconcile.")
        return "no-chat"
    ctx = run.step_context(step, log.info)
    recovered = await recover(
        ctx, StepSpec(prompt="", output_type=output), workflow.chat_id, "hard_crash"
    )
    verdict = "unfinished" if recovered.answer is None else "recovered"
    log.info(f"Step {step} of {run.workflow_id} is {verdict}.")
    return verdict
