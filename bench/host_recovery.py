"""How soon a dead host's workflow is relaunched in the fleet lab, with the shipped settings.

The fleet lab (``tests/fleet``: hosts in network namespaces, Prefect's server and its own
PostgreSQL on a control host, the ``PostgresLedger`` on a store host, the simulator behind a
front door, a process worker per worker host), deployed from ``deployments/prefect.yaml``
with none of the lab's tuned limits: the workflow's and the sweep's parameters as the YAML
and the flows' defaults give them (a 30 s heartbeat, stale after 120 s, a pass every 5
minutes, a 30 s lease) and the sweep's triggers as shipped. Only the workers are the lab's:
they ask for work every second (the README says 2 s).

Each try launches a one-step workflow on a worker host (round the hosts in turn), waits
until it holds its workflow and pulses, then kills that host whole (every process in its
namespace: the worker and the flow run), and measures from the kill until the relaunch run
is created and until it takes the workflow's next epoch in the store; the host's worker is
started again once the relaunch finished. Needs root (network namespaces).

    python -m bench.host_recovery [--tries 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.objects import FlowRun, StateType

from bench._common import load
from coder_chat.durable.postgres import PostgresStore
from coder_chat.durable.records import WorkflowRecord
from coder_chat.durable.sweep import SweepPolicy
from prefect_coder.settings import WorkflowSettings
from tests.fleet.config import (
    CREDENTIALS_SLUG,
    DURABLE_CHAT,
    LEDGER_SCHEMA,
    LEDGER_SLUG,
    Timings,
    ref,
)
from tests.fleet.fleet import Fleet
from tests.fleet.lab import open_fleet
from tests.integration.procs import until

#: The killed step's turn: long enough that the kill lands in it.
PROMPT = "/sleep 12 take your time"
TIMEOUT = 240.0


def shipped() -> Timings:
    """The lab's timings set to what a user gets without setting anything: the product's
    own defaults (``WorkflowSettings()``, the core's ``SweepPolicy()``, which the sweep
    flow's parameters default to) and the shipped YAML's schedule and lease."""
    return Timings(
        workflow=WorkflowSettings(),
        sweep=SweepPolicy(),
        sweep_interval=300,
        max_relaunches=3,
        relaunch_start=300.0,
        sweep_lease=30.0,
    )


async def one_try(fleet: Fleet, store: PostgresStore, host_name: str) -> tuple[float, float]:
    """(seconds from the kill to the relaunch run's creation, to its new epoch)."""
    assert fleet.coder is not None
    tenant = fleet.coder.organization_id
    workflow_id = f"bench-host-{uuid.uuid4().hex[:8]}"
    async with get_client() as client:
        deployment = await client.read_deployment_by_name(DURABLE_CHAT)
        await client.create_flow_run_from_deployment(
            deployment.id,
            parameters={
                "workflow_id": workflow_id,
                "prompts": [PROMPT],
                "credentials": ref(CREDENTIALS_SLUG),
                "ledger": ref(LEDGER_SLUG),
            },
            work_queue_name=host_name,
        )

    async def at_epoch(epoch: int) -> WorkflowRecord | None:
        record = await store.get_workflow(tenant, workflow_id)
        return record if record is not None and record.epoch >= epoch else None

    await until(lambda: at_epoch(1), f"{workflow_id} to begin", TIMEOUT, [], 0.2)
    await asyncio.sleep(2.0)  # it pulses (at once) and its turn is sleeping on the simulator
    host = fleet.hosts[host_name]
    killed = time.time()
    await fleet.kill_host(host)
    await until(lambda: at_epoch(2), f"{workflow_id} to be relaunched", TIMEOUT, [], 0.2)
    took_epoch = time.time() - killed
    tag = f"prefect-coder:relaunch:{workflow_id}"
    async with get_client() as client:

        async def relaunched() -> FlowRun | None:
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag]))
            )
            return runs[0] if runs else None

        relaunch = await until(relaunched, "the relaunch run", 30.0, [])
        assert relaunch.created is not None
        created = relaunch.created.timestamp() - killed

        async def done() -> FlowRun | None:
            run = await client.read_flow_run(relaunch.id)
            ended = run.state is not None and run.state.is_final()
            return run if ended else None

        finished = await until(done, "the relaunch to end", TIMEOUT, [], 0.5)
        assert finished.state is not None and finished.state.type == StateType.COMPLETED
    await fleet.start_worker(host)
    await fleet.worker_ready(host)
    return created, took_epoch


def line(label: str, values: list[float]) -> str:
    ordered = sorted(values)
    return (
        f"  {label:<34} p50 {statistics.median(ordered):6.1f} s   max {ordered[-1]:6.1f} s"
        f"   (n={len(ordered)}: {', '.join(f'{v:.1f}' for v in ordered)})"
    )


async def main(tries: int, tmp: Path) -> None:
    results: list[tuple[float, float]] = []
    async with open_fleet(tmp / "fleet", 3, shipped(), say=lambda _: None) as fleet:
        store = PostgresStore(fleet.store_dsn, schema=LEDGER_SCHEMA)
        try:
            for n in range(tries):
                host = fleet.worker_hosts[n % len(fleet.worker_hosts)].name
                created, epoch = await one_try(fleet, store, host)
                results.append((created, epoch))
                print(f"try {n + 1} ({host}): relaunch made {created:5.1f} s, epoch {epoch:5.1f} s")
        finally:
            await store.close()
    print()
    print(f"A worker host killed whole, fleet lab, shipped settings ({load()})")
    print(line("kill -> relaunch run created", [c for c, _ in results]))
    print(line("kill -> relaunch takes the epoch", [e for _, e in results]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=10)
    with tempfile.TemporaryDirectory(prefix="bench-host-recovery-") as folder:
        Path(folder).chmod(0o755)  # the private PostgreSQL servers run as "postgres" below it
        asyncio.run(main(parser.parse_args().tries, Path(folder)))
