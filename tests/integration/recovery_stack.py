"""A real Prefect stack deployed from the shipped YAML, for recovery by events: the
integration test and ``bench/recovery.py`` share it.

``prefect server start`` (its database a private PostgreSQL: SQLite locks under a loaded
machine), the pool as ``prefect work-pool create --type process`` makes it, ``prefect
deploy --all`` from ``deployments/prefect.yaml`` (its triggers become automations),
``prefect-coder simulator`` and process workers with the simulator's ``CODER_*`` variables
and one embedded store. The server runs no scheduler: every sweep pass that happens was
started by one of the sweep deployment's triggers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.settings import PREFECT_API_URL

from coder_chat.durable.records import WorkflowRecord
from coder_chat.durable.sqlite import SqliteStore
from tests.integration.procs import (
    Proc,
    Processes,
    processes,
    until,
)
from tests.integration.stack import (
    create_process_pool,
    deploy_all,
    home_env,
    start_server,
    start_simulator,
    start_worker,
)
from tests.names import PULSE
from tests.pgcluster import PgCluster
from tests.prefect_test_api import api_settings

STARTUP_TIMEOUT = 180.0
#: How often a worker asks for work (Prefect's default is 10 s; the README says to lower it).
WORKER_QUERY_SECONDS = "2"


@dataclass
class Stack:
    procs: Processes
    tmp: Path
    client: PrefectClient
    server: Proc
    simulator: Proc
    worker_env: dict[str, str]
    tenant: str
    store: SqliteStore
    workers: list[Proc] = field(default_factory=list)

    async def start_worker(self) -> Proc:
        name = f"worker-{len(self.workers) + 1}"
        worker = await start_worker(self.procs, self.worker_env, self.tmp, name)
        self.workers.append(worker)
        return worker

    @property
    def worker(self) -> Proc:
        live = [w for w in self.workers if w.running]
        assert live, "no worker is running"
        return live[-1]

    async def launch(self, workflow_id: str, prompts: list[str]) -> FlowRun:
        deployment = await self.client.read_deployment_by_name("durable-chat/durable-chat")
        return await self.client.create_flow_run_from_deployment(
            deployment.id,
            parameters={
                "workflow_id": workflow_id,
                "prompts": prompts,
                "settings": {"request_timeout_seconds": 60.0, "step_deadline_seconds": 120.0},
            },
        )

    async def workflow(self, workflow_id: str) -> WorkflowRecord | None:
        return await self.store.get_workflow(self.tenant, workflow_id)

    async def began(self, workflow_id: str, epoch: int, timeout: float) -> WorkflowRecord:
        """The workflow's record once a run has taken ``epoch`` (or a later one)."""

        async def taken() -> WorkflowRecord | None:
            record = await self.workflow(workflow_id)
            return record if record is not None and record.epoch >= epoch else None

        return await until(
            taken, f"{workflow_id} to reach epoch {epoch}", timeout, [self.server], 0.1
        )

    async def pulses(self, run_id: uuid.UUID) -> int:
        """How many of a run's pulses Prefect's server has received."""
        body = {
            "filter": {
                "event": {"name": [PULSE]},
                "resource": {"id": [f"prefect.flow-run.{run_id}"]},
            },
            "limit": 50,
        }
        response = await self.client.request("POST", "/events/filter", json=body)
        return len(response.json()["events"])

    async def pulsing(self, run_id: uuid.UUID, timeout: float) -> None:
        """Returns once Prefect has heard the run pulse (it holds its workflow)."""

        async def heard() -> bool:
            return await self.pulses(run_id) > 0

        await until(heard, f"a pulse of run {run_id}", timeout, [self.server], 0.2)

    def flow_run_group(self, worker: Proc) -> int:
        """The process group of the flow run the worker started (a session of its own)."""
        table = processes()
        tree, todo = set(), [worker.proc.pid]
        while todo:
            pid = todo.pop()
            if pid in table and pid not in tree:
                tree.add(pid)
                todo.extend(p for p, proc in table.items() if proc.ppid == pid)
        groups = {table[pid].group for pid in tree} - {worker.proc.pid}
        assert len(groups) == 1, f"the worker runs {len(groups)} flow run(s): {groups}"
        return groups.pop()

    async def kill_worker(self, worker: Proc) -> float:
        """SIGKILL the worker and every flow run it started, as a host dies; returns when."""
        killed = time.time()
        self.procs.kill(worker)
        await worker.proc.wait()
        return killed

    async def kill_flow_run(self, worker: Proc) -> float:
        """SIGKILL the flow run's process group alone; the worker lives on and says Crashed."""
        group = self.flow_run_group(worker)
        killed = time.time()
        os.killpg(group, signal.SIGKILL)
        return killed


@contextlib.asynccontextmanager
async def recovery_stack(
    procs: Processes,
    tmp: Path,
    worker_query_seconds: str = WORKER_QUERY_SECONDS,
    server_settings: dict[str, str] | None = None,
) -> AsyncIterator[Stack]:
    """The stack, deployed from the shipped YAML, with no worker yet; ``server_settings``
    are Prefect settings (environment variables) of the server's alone."""
    with PgCluster(for_prefect=True) as pg:
        env = home_env(tmp)
        # No scheduler: every sweep pass here is one a trigger started.
        server = await start_server(procs, tmp, {**env, **(server_settings or {})}, pg.dsn)
        simulator, coder = await start_simulator(procs, env, tmp, STARTUP_TIMEOUT)
        await server.healthy(STARTUP_TIMEOUT)
        cli_env = {**env, "PREFECT_API_URL": server.api}
        db = tmp / "ledger.sqlite3"
        worker_env = {
            **cli_env,
            **coder,
            "PREFECT_CODER_SQLITE_PATH": str(db),
            "PREFECT_WORKER_QUERY_SECONDS": worker_query_seconds,
        }
        async with api_settings({PREFECT_API_URL: server.api}), get_client() as client:
            await create_process_pool(client)
            await deploy_all(procs, cli_env, [server.proc], timeout=STARTUP_TIMEOUT)
            store = SqliteStore(db)
            try:
                tenant = coder["CODER_ORG_ID"]
                yield Stack(procs, tmp, client, server.proc, simulator, worker_env, tenant, store)
            finally:
                await store.close()


def new_workflow_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def sweep_runs(client: PrefectClient) -> list[FlowRun]:
    """Every run of the orphan-sweep deployment, oldest first."""
    sweep = await client.read_deployment_by_name("orphan-sweep/orphan-sweep")
    runs = await client.read_flow_runs(limit=200)
    return sorted((r for r in runs if r.deployment_id == sweep.id), key=lambda r: str(r.created))


def ended(run: FlowRun) -> bool:
    return run.state is not None and run.state.type in {
        StateType.COMPLETED,
        StateType.FAILED,
        StateType.CRASHED,
        StateType.CANCELLED,
    }


async def wait_ended(client: PrefectClient, run_id: uuid.UUID, timeout: float) -> FlowRun:
    async def done() -> FlowRun | None:
        run = await client.read_flow_run(run_id)
        return run if ended(run) else None

    return await until(done, f"run {run_id} to end", timeout, [], 0.5)
