"""What Prefect's API says about a schedule's flow runs: its workflows' runs and the sweeps."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterName,
    FlowRunFilter,
    FlowRunFilterExpectedStartTime,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.sorting import FlowRunSort, LogSort

from .config import CHARGE_CARD, CREDENTIALS_SLUG, LEDGER_SLUG, Timings, ref
from .plan import FleetWorkflow

TERMINAL = frozenset(
    {StateType.COMPLETED, StateType.FAILED, StateType.CRASHED, StateType.CANCELLED}
)
PAGE = 200


def parameters(workflow: FleetWorkflow, timings: Timings) -> dict[str, Any]:
    """``durable_chat``'s parameters, blocks by reference as in the README's step 9."""
    return {
        "workflow_id": workflow.workflow_id,
        "prompts": workflow.prompts,
        "tools": [CHARGE_CARD],
        "credentials": ref(CREDENTIALS_SLUG),
        "ledger": ref(LEDGER_SLUG),
        "settings": timings.workflow_settings(),
    }


async def deployment_runs(client: PrefectClient, deployment: str, since: datetime) -> list[FlowRun]:
    """Every run of ``deployment`` expected to start after ``since``, oldest first."""
    runs: list[FlowRun] = []
    while page := await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            expected_start_time=FlowRunFilterExpectedStartTime(after_=since)
        ),
        deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment])),
        sort=FlowRunSort.EXPECTED_START_TIME_ASC,
        limit=PAGE,
        offset=len(runs),
    ):
        runs += page
    return runs


def runs_of(runs: list[FlowRun], workflow_id: str) -> list[FlowRun]:
    return [r for r in runs if r.parameters.get("workflow_id") == workflow_id]


def ended(run: FlowRun) -> bool:
    return run.state is not None and run.state.type in TERMINAL


async def run_logs(client: PrefectClient, run_id: UUID) -> list[str]:
    logs = await client.read_logs(
        log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])),
        limit=PAGE,
        sort=LogSort.TIMESTAMP_ASC,
    )
    return [f"{log.timestamp:%H:%M:%S.%f} {log.message}" for log in logs]
