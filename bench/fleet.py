"""A fleet of 3-step workflows: many in one flow run, beside one flow run each on a process worker.

Run: ``python -m bench.fleet [--sizes 50,200,500] [--worker-runs 200] [--worker-limit 8]``.

1. **One process**: for each size N, one ``durable_chats`` flow run (in this
   process, Prefect's test API in another) runs N workflows of 3 steps at once
   (``max_at_once=N``) on the SQLite ledger, against the simulator in another
   process. Printed: wall time, steps per second, and the peak resident set of
   this process (sampled every 0.5 s from ``/proc``, and ``ru_maxrss``, which
   never goes down). Every workflow must come back with 3 steps that ran, or the
   script exits non-zero.
2. **A process worker**: the same 3-step workflow as ``--worker-runs`` separate
   ``durable-chat`` flow runs on a ``prefect server`` of its own, deployed with ``prefect deploy`` from
   ``deployments/prefect.yaml`` (that deployment only) to a process work pool
   whose concurrency limit is ``--worker-limit``, picked up by one ``prefect
   worker start`` on the same API. Printed: wall time from the first run created
   to the last one finished, steps per second, and the peak summed RSS (and PSS,
   shared pages split) of the worker's flow-run processes, sampled every 0.5 s.
   ``--worker-runs 0`` skips it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from bench._common import load, prefect_api, requests_served
from bench._procmem import MIB, Peak, own_rss, rss, sampling, tree_of
from bench._simproc import SimProcess, simulator_process

ROOT = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).parent / "prefect")
POOL = "coder-agents"  # the pool deployments/prefect.yaml names
PROMPTS = ["plan the change", "write the change", "summarise the change"]


@dataclass
class Outcome:
    runs: int
    workflows: int
    wall: float
    peak: Peak
    complete: int
    problems: list[str]
    requests: int

    @property
    def steps_per_second(self) -> float:
        return self.workflows * len(PROMPTS) / self.wall


# -- many workflows in one flow run -------------------------------------------------------------


async def one_process(sim: SimProcess, size: int, tmp: Path) -> Outcome:
    from prefect_coder.blocks import CoderCredentials, SqliteLedger
    from prefect_coder.flows.durable_chats import FleetFailed, WorkflowSpec, durable_chats

    credentials = CoderCredentials(
        base_url=sim.base_url, token=SecretStr(sim.token), organization_id=sim.organization_id
    )
    ledger = SqliteLedger(path=str(tmp / f"fleet-{size}.sqlite3"))
    tag = uuid.uuid4().hex[:6]
    specs = [
        WorkflowSpec(workflow_id=f"fleet-{size}-{tag}-{i}", prompts=list(PROMPTS))
        for i in range(size)
    ]
    before = await asyncio.to_thread(requests_served, sim)
    failed: dict[str, str] = {}
    results: dict[str, Any] = {}
    with sampling(own_rss) as peak:
        started = time.perf_counter()
        try:
            results = await durable_chats(
                workflows=specs, credentials=credentials, ledger=ledger, max_at_once=size
            )
        except FleetFailed as exc:  # the others finished: say which did not, and why
            failed = exc.failed
        wall = time.perf_counter() - started
    requests = await asyncio.to_thread(requests_served, sim) - before
    problems = [f"{workflow_id}: failed ({why})" for workflow_id, why in failed.items()]
    for spec in specs:
        steps = results.get(spec.workflow_id)
        if spec.workflow_id not in failed and (
            steps is None or [s.verdict for s in steps] != ["ran"] * len(PROMPTS)
        ):
            problems.append(f"{spec.workflow_id}: {steps!r}")
    return Outcome(1, size, wall, peak, size - len(problems), problems, requests)


# -- one flow run per workflow on a process worker ----------------------------------------------


def cli_env(api: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "CODER_"))}
    env.update(
        PREFECT_API_URL=api,
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
    )
    return env


def run_cli(*argv: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [PREFECT, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise SystemExit(f"`prefect {' '.join(argv)}` failed:\n{done.stdout}\n{done.stderr}")


@contextlib.contextmanager
def worker(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [PREFECT, "--no-prompt", "worker", "start", "--pool", POOL, "--name", "bench-worker"],
            cwd=log.parent,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        # The worker and the flow runs it started (each in a session of its own).
        from bench._procmem import descendants

        for pid in [proc.pid, *descendants(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        proc.wait()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def prefect_server(tmp: Path) -> Iterator[str]:
    """A ``prefect server`` of its own (no UI, no scheduler): its API URL.

    Not the test API of part 1, which is still recording that part's events.
    """
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    log = tmp / "server.log"
    argv = [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*argv, "--no-ui", "--no-scheduler"],
            cwd=tmp,
            env=cli_env(api, tmp / "server-home"),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        give_up = time.monotonic() + 180
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{api}/health", timeout=5).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > give_up:
                raise SystemExit(f"prefect server did not start; see {log}")
            time.sleep(0.5)
        yield api
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def process_worker(sim: SimProcess, runs: int, limit: int, tmp: Path, api: str) -> Outcome:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.objects import StateType

    env = cli_env(api, tmp / "cli-home")
    run_cli("work-pool", "create", POOL, "--type", "process", env=env)
    run_cli("work-pool", "set-concurrency-limit", POOL, str(limit), env=env)
    run_cli(
        "--no-prompt",
        "deploy",
        "--prefect-file",
        "deployments/prefect.yaml",
        "--name",
        "durable-chat",
        env=env,
    )
    worker_env = {
        **cli_env(api, tmp / "worker-home"),
        "CODER_URL": sim.base_url,
        "CODER_SESSION_TOKEN": sim.token,
        "CODER_ORG_ID": sim.organization_id,
        "PREFECT_CODER_SQLITE_PATH": str(tmp / "worker-ledger.sqlite3"),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
    }
    terminal = {StateType.COMPLETED, StateType.FAILED, StateType.CRASHED, StateType.CANCELLED}
    tag = uuid.uuid4().hex[:6]
    before = await asyncio.to_thread(requests_served, sim)
    async with get_client() as client:
        deployment = await client.read_deployment_by_name("durable-chat/durable-chat")
        with worker(worker_env, tmp / "worker.log") as proc, sampling(tree_of(proc.pid)) as peak:
            started = time.perf_counter()
            ids = [
                (
                    await client.create_flow_run_from_deployment(
                        deployment.id,
                        parameters={"workflow_id": f"proc-{tag}-{i}", "prompts": list(PROMPTS)},
                    )
                ).id
                for i in range(runs)
            ]
            while True:
                found = await client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
                    limit=runs + 10,
                )
                ended = [r for r in found if r.state is not None and r.state.type in terminal]
                if len(ended) >= runs:
                    break
                if proc.poll() is not None:
                    raise SystemExit(f"the worker exited; see {tmp / 'worker.log'}")
                await asyncio.sleep(0.5)
            wall = time.perf_counter() - started
            worker_rss = rss(proc.pid)
        requests = await asyncio.to_thread(requests_served, sim) - before
        by_id = {r.id: r for r in found}
        workflow_ids = [f"proc-{tag}-{i}" for i in range(runs)]
        bad: dict[str, list[str]] = {}
        for workflow_id, run_id in zip(workflow_ids, ids, strict=True):
            state = by_id[run_id].state
            if state is None or state.type != StateType.COMPLETED:
                bad.setdefault(workflow_id, []).append(f"flow run {run_id}: {state}")
    # The flow runs' results are not persisted: the ledger says what each workflow did.
    for workflow_id, why in await finished_in_store(
        tmp / "worker-ledger.sqlite3", sim.organization_id, workflow_ids
    ):
        bad.setdefault(workflow_id, []).append(why)
    problems = [f"{workflow_id}: {'; '.join(why)}" for workflow_id, why in bad.items()]
    print(f"  (the worker process itself: {worker_rss / MIB:.0f} MiB resident at the end)")
    return Outcome(runs, runs, wall, peak, runs - len(bad), problems, requests)


async def finished_in_store(
    path: Path, tenant: str, workflow_ids: list[str]
) -> list[tuple[str, str]]:
    """Each workflow that is not FINISHED with its 3 steps in the ledger, and why."""
    from coder_chat.durable.records import WorkflowState
    from coder_chat.durable.sqlite import SqliteStore

    problems = []
    store = SqliteStore(path)
    try:
        for workflow_id in workflow_ids:
            record = await store.get_workflow(tenant, workflow_id)
            steps = [await store.get_step(tenant, workflow_id, n + 1) for n in range(len(PROMPTS))]
            if record is None or record.state != WorkflowState.FINISHED or None in steps:
                state = record.state if record else "no record"
                done = sum(s is not None for s in steps)
                problems.append((workflow_id, f"ledger: {state}, {done} step(s) stored"))
    finally:
        await store.close()
    return problems


# -- report -------------------------------------------------------------------------------------


def header() -> None:
    print(
        f"  {'how':<26} {'workflows':>9} {'wall s':>8} {'steps/s':>8} {'requests':>9} "
        f"{'peak RSS MiB':>13} {'complete':>9}"
    )


def row(how: str, outcome: Outcome, memory: str) -> None:
    print(
        f"  {how:<26} {outcome.workflows:>9} {outcome.wall:>8.1f} "
        f"{outcome.steps_per_second:>8.1f} {outcome.requests:>9} {memory:>13} "
        f"{outcome.complete:>5}/{outcome.workflows:<3}",
        flush=True,
    )
    for problem in outcome.problems[:5]:
        print(f"    not complete: {problem}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,200,500", help="workflows per flow run")
    parser.add_argument("--worker-runs", type=int, default=200, help="flow runs on the worker")
    parser.add_argument("--worker-limit", type=int, default=8, help="the pool's concurrency")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(f"fleet: 3-step workflows; the simulator in another process; {load()}")
    failed = False
    with simulator_process() as sim, prefect_api() as tmp:
        print(f"\none flow run of durable_chats in this process (at start {rss() / MIB:.0f} MiB):")
        header()
        for size in sizes:
            outcome = asyncio.run(one_process(sim, size, tmp))
            maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            row(f"durable_chats x{size}", outcome, f"{outcome.peak.rss / MIB:.0f}")
            print(f"    ru_maxrss so far {maxrss / MIB:.0f} MiB; {load()}")
            failed |= bool(outcome.problems)
        if args.worker_runs:
            print(
                f"\n{args.worker_runs} durable-chat flow runs on a process worker "
                f"(pool concurrency limit {args.worker_limit}):"
            )
            with prefect_server(tmp) as api:
                from prefect.settings import PREFECT_API_URL, temporary_settings

                with temporary_settings(updates={PREFECT_API_URL: api}):
                    outcome = asyncio.run(
                        process_worker(sim, args.worker_runs, args.worker_limit, tmp, api)
                    )
            header()
            row(
                f"process worker, {args.worker_limit} at once",
                outcome,
                f"{outcome.peak.rss / MIB:.0f}",
            )
            print(
                f"    peak PSS {outcome.peak.pss / MIB:.0f} MiB, peak {outcome.peak.processes} "
                f"flow-run processes, {outcome.wall / outcome.runs:.2f} s per run; {load()}"
            )
            failed |= bool(outcome.problems)
    if failed:
        raise SystemExit("some workflows did not complete with 3 results")
    print("\nevery workflow completed with 3 results")


if __name__ == "__main__":
    main()
