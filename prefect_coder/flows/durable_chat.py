"""``durable_chat``: one Coder chat, step by step, that survives crashes of the process running it.

Launch it from the Prefect UI (or ``durable_chat(...)`` in Python) with a
``workflow_id`` of your choosing. Re-running the same ``workflow_id`` after a
crash resumes it, on any machine: finished steps come from the store, an
interrupted step is recovered or safely resubmitted, and the dead run can never
act again (each run takes a new fencing epoch in the store). It is a few lines on
the public API, :class:`~prefect_coder.chat.DurableChat`: your own flows can do the
same and decide each prompt as they go.
"""

from collections.abc import Sequence

from prefect import flow

from coder_chat.durable.step import StepResult
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.chat import DEFAULT_SETTINGS, DurableChat
from prefect_coder.imports import import_model
from prefect_coder.settings import WorkflowSettings


@flow(name="durable-chat")
async def durable_chat(
    workflow_id: str,
    prompts: list[str],
    tools: Sequence[str] = (),
    output_schemas: Sequence[str] = (),
    credentials: CoderCredentials | None = None,
    ledger: SqliteLedger | PostgresLedger | None = None,
    settings: WorkflowSettings = DEFAULT_SETTINGS,
) -> list[StepResult]:
    """Run ``prompts`` as the steps of one durable Coder chat.

    Args:
        workflow_id: Your name for this workflow; run it again to resume after a crash.
        prompts: One prompt per step, run in order on the same chat.
        tools: Client tools as import paths (``module:function``): durable tools
            (``@durable_tool``), or plain async functions if the settings allow them.
        output_schemas: Per step, the import path of a pydantic model for a structured
            answer; empty (or missing) for a text answer.
        credentials: Saved Coder credentials (none: CODER_URL, CODER_SESSION_TOKEN and
            CODER_ORG_ID from the worker's environment).
        ledger: Where progress is stored (none: the embedded SQLite store).
        settings: The chat's setup and each step's time limits.
    """
    schemas = list(output_schemas)
    async with DurableChat(
        workflow_id,
        credentials=credentials,
        ledger=ledger,
        tools=tools,
        settings=settings,
        expected_turns=len(prompts),
    ) as chat:
        for step, prompt in enumerate(prompts, start=1):
            schema = schemas[step - 1] if step <= len(schemas) else ""
            await chat.turn(prompt, output=import_model(schema))
    return chat.results
