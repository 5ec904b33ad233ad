"""What the flow tests share: the refund script, what reached Coder, how a replaced run
ended, a run's logs."""

from __future__ import annotations

import json
from uuid import UUID

from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterName,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun, Log, StateType, TaskRun
from prefect.logging.handlers import APILogHandler

from coder_chat.simulator import Simulator
from prefect_coder import DurableChat

#: The words of the refund step's prompt the scripted model answers with the refund tool.
REFUND = "with issue_refund"


def script_refund(sim: Simulator, order_id: str, amount_cents: int) -> None:
    """The scripted model plans ``amount_cents`` and refunds it with the tool."""
    plan = {"amount_cents": amount_cents, "reason": "broken on arrival"}
    sim.script(f"Order {order_id}: ", f"/json {json.dumps(plan)}")
    refund = {"order_id": order_id, "amount_cents": amount_cents}
    sim.script(f"for order {order_id} {REFUND}", f"/tool issue_refund {json.dumps(refund)}")


def sent(sim: Simulator, text: str) -> int:
    """How many prompts the server holds with ``text`` in them (a step's marker, a prompt)."""
    return sum(
        1
        for chat in sim.chats()
        for m in sim.messages(chat.id)
        if m.role == "user" and text in json.dumps(m.content)
    )


async def superseded_by_its_successor(workflow_id: str) -> FlowRun:
    """Epoch 1's run of ``workflow_id`` ended Cancelled/Superseded naming epoch 2's run,
    which is returned."""
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=workflow_id))
        )
    by_epoch = {r.name: r for r in runs}
    old, new = by_epoch[f"{workflow_id} · epoch 1"], by_epoch[f"{workflow_id} · epoch 2"]
    assert old.state is not None and old.state.type == StateType.CANCELLED
    assert old.state.name == "Superseded" and new.name in (old.state.message or "")
    return new


async def task_runs_of(client: PrefectClient, flow_run_id: UUID) -> list[TaskRun]:
    """The task runs of a flow run."""
    return await client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    )


async def run_logs(client: PrefectClient, flow_run_id: UUID) -> list[Log]:
    """Every line of the run and its task runs, in order (the API gives 200 at a time)."""
    await APILogHandler.aflush()
    logs: list[Log] = []
    while True:
        page = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
            limit=200,
            offset=len(logs),
        )
        logs += page
        if len(page) < 200:
            return logs


class Crash(BaseException):
    """Stands for a killed process: the workflow's end never runs."""


async def first_then_second(
    chat: DurableChat, first: str, second: str, *, crash: bool
) -> list[str]:
    """``first`` then ``second`` on ``chat``; with ``crash``, the run dies between them."""
    async with chat:
        await chat.turn(first)
        if crash:
            raise Crash
        await chat.turn(second)
    return [r.verdict for r in chat.results]
