"""``prefect-coder workflows cancel|resume`` on a SQLite file and on Postgres (each test on
both): a workflow whose run died is cancelled from the command line, then resumed to its
end by a run of its deployment, sending nothing that had finished.

The flow's runs come from a deployment and are executed in this process (``run_flow`` with
the run Prefect made), as a worker would start them.
"""

from __future__ import annotations

import json
import re
from typing import Any
from uuid import UUID

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.flow_engine import run_flow
from pydantic import SecretStr

from coder_chat.durable.records import WorkflowState
from coder_chat.simulator import Simulator
from prefect_coder import DurableChat, PostgresLedger, SqliteLedger
from tests.durable.backends import Backend
from tests.flows.support import Crash, first_then_second, sent

from .support import Cli

pytestmark = [pytest.mark.usefixtures("prefect_api"), pytest.mark.timeout(120)]

FIRST = "Read the pull request"
SECOND = "Write the review"


@flow
async def review(
    workflow_id: str, sqlite: str = "", postgres_schema: str = "", crash: bool = False
) -> list[str]:
    """Two turns on the store the test names (the DSN comes from the environment)."""
    import os

    ledger: SqliteLedger | PostgresLedger = (
        SqliteLedger(path=sqlite)
        if sqlite
        else PostgresLedger(
            dsn=SecretStr(os.environ["PREFECT_CODER_POSTGRES_DSN"]), db_schema=postgres_schema
        )
    )
    return await first_then_second(
        DurableChat(workflow_id, ledger=ledger), FIRST, SECOND, crash=crash
    )


async def execute(run_id: UUID) -> Any:
    async with get_client() as client:
        run = await client.read_flow_run(run_id)
    return await run_flow(review, flow_run=run, parameters=run.parameters)  # type: ignore[arg-type,misc]


async def test_cancel_then_resume_from_the_command_line(
    sim: Simulator,
    backend: Backend,
    cli: Cli,
    store_args: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in sim.env().items():
        monkeypatch.setenv(name, value)
    if backend.is_postgres:
        where = {"postgres_schema": backend.location}
    else:
        where = {"sqlite": backend.location}
    wid, org = "review-707", str(sim.organization_id)
    deployment = await (await review.ato_deployment(name="reviews")).aapply()
    async with get_client() as client:
        first = await client.create_flow_run_from_deployment(
            deployment, parameters={"workflow_id": wid, "crash": True, **where}
        )
    with pytest.raises(Crash):
        await execute(first.id)

    code, out, err = await cli("workflows", "cancel", wid, *store_args, "--org", org)
    assert (code, err) == (0, ""), out
    assert f"Workflow {wid} is cancelled." in out
    code, out, _ = await cli("workflows", "show", wid, *store_args, "--org", org, "--json")
    shown = json.loads(out)["workflow"]
    assert shown["state"] == WorkflowState.CANCELLED and sim.chat(shown["chat_id"]).archived
    # Cancelling it again is refused, in one line.
    code, _, err = await cli("workflows", "cancel", wid, *store_args, "--org", org)
    assert code == 2 and "is cancelled, not running" in err

    code, out, err = await cli("workflows", "resume", wid, *store_args, "--org", org)
    assert (code, err) == (0, ""), out
    resumed = re.search(r"as flow run '[^']+' \(.*?([0-9a-f-]{36})\)", out)
    assert resumed is not None, out
    # The resumed run is the deployment's, with its parameters but for the crash: the fix.
    async with get_client() as client:
        await client.update_flow_run(
            UUID(resumed.group(1)), parameters={"workflow_id": wid, "crash": False, **where}
        )
    assert await execute(UUID(resumed.group(1))) == ["stored", "ran"]
    code, out, _ = await cli("workflows", "show", wid, *store_args, "--org", org, "--json")
    assert json.loads(out)["workflow"]["state"] == WorkflowState.FINISHED
    assert sent(sim, FIRST) == 1 and sent(sim, SECOND) == 1
    # A finished workflow is not resumed.
    code, _, err = await cli("workflows", "resume", wid, *store_args, "--org", org)
    assert code == 2 and "only a failed, cancelled or stranded workflow is resumed" in err
