"""Recovery by events, from the shipped YAML: a dead host's run is relaunched by a pass of
the orphan sweep that its stopped pulse started, not by the 5-minute schedule.

A real ``prefect server`` (no scheduler, so no scheduled pass can happen), ``prefect
deploy`` from deployments/prefect.yaml, a process worker and ``prefect-coder simulator``.

A flow-run process killed alone (the worker reports it Crashed, and the crash trigger's
pass relaunches it) is ``bench.recovery``'s flow-run try, on the same stack: its run in
tests/docs/test_recovery_command.py fails unless the crash trigger's pass relaunched the
workflow and the relaunch finished it, the killed run ending Superseded.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterTags,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import StateType

from coder_chat.durable.records import WorkflowState
from tests.integration.procs import NEEDS_PROC, Processes, managed_processes, until
from tests.integration.recovery_stack import (
    Stack,
    new_workflow_id,
    recovery_stack,
    sweep_runs,
    wait_ended,
)

#: Bounds for cold processes on a loaded machine; nothing here is timed.
TIMEOUT = 180.0
#: How often the server evaluates proactive triggers (Prefect's default is 5 s), and how
#: often a worker asks for work (the docs say 2 s): both Prefect settings, lowered so
#: that a test waits less on the clock; what the triggers and the workers do is the same.
PROACTIVE_SECONDS = 1


def fast_stack(procs: Processes, tmp: Path) -> contextlib.AbstractAsyncContextManager[Stack]:
    server = {
        "PREFECT_SERVER_EVENTS_PROACTIVE_GRANULARITY": f"PT{PROACTIVE_SECONDS}S",
        # Prefect's own block types, registered at every start: nothing here uses a block.
        "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
    }
    return recovery_stack(procs, tmp, worker_query_seconds="1", server_settings=server)


pytestmark = [pytest.mark.timeout(600), NEEDS_PROC]


PULSE_TRIGGER = "orphan-sweep on a run whose pulse stopped"
#: Longer than the pulse trigger's window (15 s) and a proactive evaluation together, with
#: 5 s to spare.
QUIET_WATCH = 15.0 + PROACTIVE_SECONDS + 5.0
#: How long a pass's log lines may take to reach the API after it ended.
LOG_WAIT = 30.0


async def a_pass_told_silent(client: PrefectClient, run_id: UUID) -> tuple[set[UUID], list[str]]:
    """Sweep passes told ``run_id`` is silent (one more when the deployment's one slot
    refused it: another pass was going), and the last one's log lines, read until its
    verdict on the run is there (lines reach the API after the run has ended)."""
    sweep = await client.read_deployment_by_name("orphan-sweep/orphan-sweep")
    made: set[UUID] = set()
    for _ in range(5):
        told = await client.create_flow_run_from_deployment(
            sweep.id, parameters={"silent_flow_run": f"prefect.flow-run.{run_id}"}
        )
        made.add(told.id)
        ended = await wait_ended(client, told.id, TIMEOUT)
        message = (ended.state.message if ended.state else None) or ""
        if "concurrency" not in message.lower():
            break
        await asyncio.sleep(2.0)
    said: list[str] = []

    async def spoke() -> bool:
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[told.id]))
        )
        said[:] = [log.message for log in logs]
        return any("went silent" in line for line in said)

    with contextlib.suppress(AssertionError):  # the caller's assertion shows the lines
        await until(spoke, "the pass's verdict in its log", LOG_WAIT, [], 0.5)
    return made, said


async def test_a_dead_host_is_known_by_its_stopped_pulse(tmp_path: Path) -> None:
    """The worker and its flow run SIGKILLed together (a host dies): nobody reports the
    run, its pulse stops, and the trigger on that starts the pass that marks it Crashed
    and relaunches it. Prefect's own heartbeat (30 s at best) plays no part; and a run that
    ended well after its pulse starts no pass."""
    async with managed_processes(tmp_path) as procs, fast_stack(procs, tmp_path) as stack:
        client = stack.client
        worker = await stack.start_worker()
        workflow_id = new_workflow_id("it-pulse")
        # Step 1 must still run when its host dies: long enough for the checks before the
        # kill on a loaded machine (a CI run once took over 40 s to reach it).
        run = await stack.launch(workflow_id, ["/sleep 75 take your time", "say goodbye"])
        await stack.began(workflow_id, 1, TIMEOUT)
        await stack.pulsing(run.id, TIMEOUT)

        # A pass told the run is silent (a trigger that fired while Prefect's server was
        # away, say) finds it pulsing and leaves it be.
        told, said = await a_pass_told_silent(client, run.id)
        assert any("went silent but spoke since (a pulse" in line for line in said), said
        alive = await client.read_flow_run(run.id)
        assert alive.state is not None and alive.state.type == StateType.RUNNING, alive.state
        assert (await stack.workflow(workflow_id)).epoch == 1  # type: ignore[union-attr]

        await stack.kill_worker(worker)
        await stack.start_worker()

        await stack.began(workflow_id, 2, TIMEOUT)
        passes = [p for p in await sweep_runs(client) if p.id not in told]
        # On a loaded machine Prefect's own heartbeat may come late while the run lives,
        # and the heartbeat trigger's pass find it pulsing: the pulse's pass is looked for.
        by_pulse = [
            p for p in passes if p.created_by and p.created_by.display_value == PULSE_TRIGGER
        ]
        assert by_pulse, [(p.created_by, p.parameters.get("because")) for p in passes]
        first = by_pulse[0]
        assert first.parameters["because"].startswith("no pulse from run "), first.parameters
        assert first.parameters["silent_flow_run"] == f"prefect.flow-run.{run.id}"
        dead = await client.read_flow_run_states(run.id)
        crashed = [s for s in dead if s.type == StateType.CRASHED]
        assert crashed and "went silent (no pulse from run" in (crashed[0].message or "")

        tag = f"prefect-coder:relaunch:{workflow_id}"
        [relaunch] = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag]))
        )
        done = await wait_ended(client, relaunch.id, TIMEOUT)
        assert done.state is not None and done.state.type == StateType.COMPLETED, done.state
        finished = await stack.workflow(workflow_id)
        assert finished is not None and finished.state == WorkflowState.FINISHED

        # The relaunch pulsed while it held the workflow and said so when it stopped: its
        # end is not taken for a death.
        before = {p.id for p in await sweep_runs(client)}
        await asyncio.sleep(QUIET_WATCH)
        later = [p for p in await sweep_runs(client) if p.id not in before]
        assert not [p for p in later if p.parameters.get("silent_flow_run")], later
