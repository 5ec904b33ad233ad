"""The prune-workflows flow on Prefect's test API: what it removes, its log line and its
table artifact; on the embedded SQLite store and on a Postgres ledger block."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogHandler
from pydantic import SecretStr

from coder_chat.durable.records import WorkflowState
from prefect_coder.blocks import PostgresLedger
from prefect_coder.flows.prune_workflows import prune_workflows
from prefect_coder.tasks.prune import ARTIFACT_KEY
from tests.durable.backends import Backend
from tests.durable.seed import age_workflow, seed_workflow

pytestmark = pytest.mark.usefixtures("prefect_api")

T = "org-prune"


async def messages(flow_run_id: UUID) -> list[str]:
    await APILogHandler.aflush()
    async with get_client() as client:
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200
        )
    return [log.message for log in logs]


async def latest_table() -> tuple[str, str]:
    async with get_client() as client:
        artifacts = await client.read_latest_artifacts()
    [table] = [a for a in artifacts if a.key == ARTIFACT_KEY]
    return str(table.description), str(table.data)


async def test_the_flow_prunes_the_embedded_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("PREFECT_CODER_SQLITE_PATH", str(db))
    monkeypatch.setenv("CODER_ORG_ID", T)
    backend = Backend("sqlite", str(db))
    store = backend.open()
    try:
        await seed_workflow(store, T, "ancient")
        await seed_workflow(store, T, "ancient-failed", state=WorkflowState.FAILED)
        await seed_workflow(store, T, "ancient-running", state=None)
        await seed_workflow(store, T, "fresh")
        for wf in ("ancient", "ancient-failed", "ancient-running"):
            await age_workflow(backend, T, wf, days=45)

        dry = await prune_workflows(dry_run=True, return_state=True)
        assert await dry.aresult() == ["ancient", "ancient-failed"]
        assert await store.get_workflow(T, "ancient") is not None
        description, _ = await latest_table()
        assert description.startswith("Would remove 2 workflows")

        state = await prune_workflows(return_state=True)
        assert await state.aresult() == ["ancient", "ancient-failed"]
        said = "Removed 2 workflows that ended more than 30 days ago: ancient, ancient-failed."
        assert state.state_details.flow_run_id is not None
        assert said in await messages(state.state_details.flow_run_id)
        description, data = await latest_table()
        assert description == said
        assert "ancient-failed" in data and "removed" in data and "fresh" not in data
        for wf in ("ancient", "ancient-failed"):
            assert await store.get_workflow(T, wf) is None
            assert await store.list_steps(T, wf) == []
        for wf in ("ancient-running", "fresh"):
            assert await store.get_workflow(T, wf) is not None

        assert await prune_workflows() == []
        description, _ = await latest_table()
        assert description == "Removed no workflows: none ended more than 30 days ago."
    finally:
        await backend.aclose()


async def test_the_flow_prunes_a_postgres_ledger(
    pg: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CODER_ORG_ID", raising=False)
    store = pg.open()
    await seed_workflow(store, T, "old-failed", state=WorkflowState.FAILED)
    await seed_workflow(store, T, "old-finished")
    for wf in ("old-failed", "old-finished"):
        await age_workflow(pg, T, wf, days=3)
    ledger = PostgresLedger(dsn=SecretStr(pg.dsn), db_schema=pg.location)
    pruned = await prune_workflows(
        older_than_days=2, states=["failed"], organization_id=T, ledger=ledger
    )
    assert pruned == ["old-failed"]
    assert await store.get_workflow(T, "old-failed") is None
    assert await store.get_workflow(T, "old-finished") is not None
    description, _ = await latest_table()
    assert description == ("Removed 1 failed workflow that ended more than 2 days ago: old-failed.")


async def test_without_a_tenant_the_flow_fails_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CODER_ORG_ID", raising=False)
    monkeypatch.setenv("PREFECT_CODER_SQLITE_PATH", str(tmp_path / "ledger.sqlite3"))
    state = await prune_workflows(return_state=True)
    assert state.is_failed()
    with pytest.raises(ValueError, match="whose workflows"):
        await state.aresult()
