"""A fleet of 3-turn workflows: bare sessions, plain Prefect tasks and ``durable_chats``, side by side.

Run: ``python -m bench.fleet [--sizes 50,200,500] [--postgres-sizes all] [--repeat 5]
[--repeat-size 200] [--worker-runs 0] [--worker-limit 8] [--dsn postgresql://…] [--no-pin]``.

Everything runs in one process against one simulator process (deltas not paced) and one
Prefect test API (a temporary server in a subprocess). For each size N, N workflows of 3
turns each, all N at once, as:

- **(a) bare**: ``coder_chat.ChatSession`` conversations on one shared ``ChatClient``,
  ``asyncio.gather``-ed; no Prefect, no store;
- **(b) plain tasks**, what a user would write without this project: one Prefect flow
  whose workflows each call a ``@task(persist_result=True)`` per turn, in sequence (the
  task makes the turn with a ``ChatSession`` on a shared ``ChatClient``, resuming the chat
  the previous turn returned, and returns a small pydantic model), N workflows gathered;
- **(c) durable_chats**: one ``durable_chats`` flow run of the same N workflows,
  ``max_at_once=N``, on the SQLite ledger (one file for the whole run);
- **(c') durable_chats on Postgres**: the same on the ``PostgresLedger`` (a throwaway
  schema, dropped at the end), for ``--postgres-sizes``.

Each row prints its wall time, steps (turns) per second, this process's CPU time per step
(every thread), the peak resident set of this process (sampled every 0.5 s, and what it
held when the row began), Coder requests per step (the simulator's request log), and what
this process asked of Prefect's API per step (``bench._prefect_calls``: HTTP requests,
events, log records), and where wall time went without work moving (``bench._pauses``): the
full garbage collections and their seconds, and the event loop's longest stall. Prefect's log
and event workers are drained at the end of a row,
inside its CPU and API counts but after its wall time. Then the ratios c/b, c/a and c'/b
of wall time and of CPU per step, per N.

This process runs on the first CPU and the processes it started on the others (``--no-pin``
to share them all): the server's work on a row, about twice the row's own CPU, would otherwise
take turns with the row it measures.

Prefect's server goes on working after a row's client is done: it records the task runs,
states and logs the row sent. Each row therefore starts once the processes this one
started (that server and the simulator) are quiet, and ends when they are quiet again;
their CPU over the row, tail included, is printed per step beside this process's
("helpers"), and the tail's length beside the wall time. Without that wait, a row ran
beside the server's work on the row before it, and paid for it.

**Steadiness**: the same fleet (``--repeat-size`` workflows) ``--repeat`` times in this
one process, (b) and (c) interleaved; each wall time, and the slowest/fastest ratio of
each; then c/b round by round (each c beside the b run just before it) and the median of
those ratios, the figure least moved by the machine's drift.

**A process worker** (``--worker-runs``, 0 skips it): the same workflow as separate
``durable-chat`` flow runs on a ``prefect server`` of its own, deployed with ``prefect
deploy`` from ``deployments/prefect.yaml`` to a process work pool whose concurrency limit
is ``--worker-limit``, picked up by one ``prefect worker start``. Printed: wall time from
the first run created to the last one finished, steps per second, and the peak summed RSS
(and PSS, shared pages split) of the worker's flow-run processes.

Every row checks that each of its workflows answered its 3 turns (for (c), 3 steps that
ran; for the worker, the ledger); the script exits non-zero otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prefect import flow, task
from pydantic import BaseModel, SecretStr

from bench import _prefect_calls
from bench._common import (
    drop_schema,
    load,
    postgres_reachable,
    prefect_api,
    requests_served,
)
from bench._pauses import Pauses, full_collections, loop_stalls
from bench._prefect_calls import ApiCalls
from bench._procmem import (
    MIB,
    Peak,
    apart_from_helpers,
    helpers_cpu,
    own_rss,
    rss,
    sampling,
    settle,
    tree_of,
)
from bench._simproc import SimProcess, simulator_process
from coder_chat import ChatClient, ChatSession
from tests.ports import free_port
from tests.prefect_test_api import migrated_sqlite

ROOT = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).parent / "prefect")
POOL = "coder-agents"  # the pool deployments/prefect.yaml names
PROMPTS = ["plan the change", "write the change", "summarise the change"]
DEFAULT_DSN = "postgresql://127.0.0.1:5432/test"


@dataclass
class Row:
    """One measured fleet."""

    kind: str  # a, b, c, c' or worker
    how: str
    workflows: int
    wall: float
    peak: Peak
    requests: int
    complete: int
    problems: list[str]
    #: CPU seconds of this process (every thread) over the row, drain included.
    cpu: float | None = None
    #: This process's resident set when the row began.
    rss_start: int = 0
    #: CPU seconds of the processes this one started (Prefect's server, the simulator)
    #: from the row's start until they were quiet after it.
    helpers_cpu: float | None = None
    #: Seconds those processes went on working after the row's client was done.
    tail: float = 0.0
    calls: ApiCalls | None = None
    runs: int = 1
    pauses: Pauses | None = None

    @property
    def steps(self) -> int:
        return self.workflows * len(PROMPTS)

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.wall

    @property
    def cpu_ms_per_step(self) -> float | None:
        return None if self.cpu is None else self.cpu / self.steps * 1000

    @property
    def helpers_ms_per_step(self) -> float | None:
        return None if self.helpers_cpu is None else self.helpers_cpu / self.steps * 1000


#: A row's work: run the fleet in a fresh event loop, return what did not complete.
Body = Callable[[], Coroutine[Any, Any, list[str]]]


def measure(
    sim: SimProcess,
    kind: str,
    how: str,
    workflows: int,
    body: Body,
    profiler: cProfile.Profile | None = None,
) -> Row:
    """Run ``body`` once in its own event loop and measure it (see the module's doc);
    ``profiler`` is enabled around the event loop's run (``bench.fleet_profile``)."""
    _prefect_calls.install()
    _prefect_calls.drain()  # what earlier rows left is theirs
    gc.collect()
    settle()  # and what the server still does for them
    helpers = helpers_cpu()
    requests = requests_served(sim)
    calls = _prefect_calls.COUNTS.snapshot()
    rss_start = rss()
    cpu = time.process_time()
    pauses = Pauses()

    async def watched() -> list[str]:
        async with loop_stalls(pauses):
            return await body()

    with sampling(own_rss) as peak, full_collections(pauses):
        started = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        try:
            problems = asyncio.run(watched())
        finally:
            if profiler is not None:
                profiler.disable()
        wall = time.perf_counter() - started
        _prefect_calls.drain()
    cpu = time.process_time() - cpu
    tail = settle()
    helpers = helpers_cpu() - helpers
    calls = _prefect_calls.COUNTS.snapshot() - calls
    requests = requests_served(sim) - requests
    return Row(
        kind,
        how,
        workflows,
        wall,
        peak,
        requests,
        workflows - len(problems),
        problems,
        cpu=cpu,
        rss_start=rss_start,
        helpers_cpu=helpers,
        tail=tail,
        calls=calls,
        pauses=pauses,
    )


def answered(workflow_id: str, texts: Sequence[str] | BaseException | None) -> str | None:
    """Why a workflow did not answer its 3 turns, or ``None`` when it did."""
    if isinstance(texts, BaseException):
        return f"{workflow_id}: {type(texts).__name__}: {texts}"
    if texts is None or len(texts) != len(PROMPTS) or not all(texts):
        return f"{workflow_id}: {texts!r}"
    return None


# -- (a) bare sessions ----------------------------------------------------------------------------


def bare(sim: SimProcess, size: int) -> Body:
    async def body() -> list[str]:
        async with ChatClient(base_url=sim.base_url, token=sim.token) as client:

            async def one() -> list[str]:
                session = ChatSession(client=client, organization_id=sim.organization_id)
                return [(await session.generate(prompt)).text for prompt in PROMPTS]

            found = await asyncio.gather(*(one() for _ in range(size)), return_exceptions=True)
        why = (answered(f"bare-{i}", texts) for i, texts in enumerate(found))
        return [w for w in why if w]

    return body


# -- (b) plain Prefect tasks, one per turn ----------------------------------------------------------


class Reply(BaseModel):
    """What a plain turn task returns: where the chat stands, and the answer."""

    chat_id: str
    last_seen_message_id: int | None
    text: str


@dataclass
class Peer:
    """What the plain tasks share, as a module-level client would be shared."""

    client: ChatClient
    organization_id: str


_PEER: list[Peer] = []


@task(persist_result=True)
async def plain_turn(
    workflow_id: str, prompt: str, chat_id: str | None, last_seen_message_id: int | None
) -> Reply:
    """One turn of a workflow's chat (a new chat when ``chat_id`` is ``None``)."""
    peer = _PEER[-1]
    session = ChatSession(
        client=peer.client,
        organization_id=peer.organization_id,
        chat_id=chat_id,
        last_seen_message_id=last_seen_message_id,
    )
    result = await session.generate(prompt)
    return Reply(
        chat_id=result.chat_id,
        last_seen_message_id=result.last_seen_message_id,
        text=result.text,
    )


@flow(name="plain-turns")
async def plain_turns(workflow_ids: list[str], prompts: list[str]) -> dict[str, list[Reply] | str]:
    """Each workflow's turns in sequence, every workflow at once; a failure is its message."""

    async def one(workflow_id: str) -> list[Reply]:
        replies: list[Reply] = []
        chat_id: str | None = None
        last_seen: int | None = None
        for prompt in prompts:
            reply = await plain_turn(workflow_id, prompt, chat_id, last_seen)
            chat_id, last_seen = reply.chat_id, reply.last_seen_message_id
            replies.append(reply)
        return replies

    found = await asyncio.gather(*(one(w) for w in workflow_ids), return_exceptions=True)
    return {
        w: f"{type(r).__name__}: {r}" if isinstance(r, BaseException) else r
        for w, r in zip(workflow_ids, found, strict=True)
    }


def plain(sim: SimProcess, size: int) -> Body:
    async def body() -> list[str]:
        tag = uuid.uuid4().hex[:6]
        workflow_ids = [f"plain-{size}-{tag}-{i}" for i in range(size)]
        async with ChatClient(base_url=sim.base_url, token=sim.token) as client:
            _PEER.append(Peer(client, sim.organization_id))
            try:
                found = await plain_turns(workflow_ids, list(PROMPTS))
            finally:
                _PEER.pop()
        problems = []
        for workflow_id in workflow_ids:
            replies = found.get(workflow_id)
            texts = [r.text for r in replies] if isinstance(replies, list) else None
            why = answered(workflow_id, texts)
            if why:
                problems.append(why if texts is not None else f"{workflow_id}: {replies}")
        return problems

    return body


# -- (c) durable_chats ------------------------------------------------------------------------------


def durable(sim: SimProcess, size: int, ledger: Any) -> Body:
    async def body() -> list[str]:
        from prefect_coder.blocks import CoderCredentials
        from prefect_coder.flows.durable_chats import FleetFailed, WorkflowSpec, durable_chats

        credentials = CoderCredentials(
            base_url=sim.base_url, token=SecretStr(sim.token), organization_id=sim.organization_id
        )
        tag = uuid.uuid4().hex[:6]
        specs = [
            WorkflowSpec(workflow_id=f"fleet-{size}-{tag}-{i}", prompts=list(PROMPTS))
            for i in range(size)
        ]
        failed: dict[str, str] = {}
        results: dict[str, Any] = {}
        try:
            results = await durable_chats(
                workflows=specs, credentials=credentials, ledger=ledger, max_at_once=size
            )
        except FleetFailed as exc:  # the others finished: say which did not, and why
            failed = exc.failed
        problems = [f"{workflow_id}: failed ({why})" for workflow_id, why in failed.items()]
        for spec in specs:
            steps = results.get(spec.workflow_id)
            if spec.workflow_id in failed:
                continue
            if steps is None or [s.verdict for s in steps] != ["ran"] * len(PROMPTS):
                problems.append(f"{spec.workflow_id}: {steps!r}")
            elif why := answered(spec.workflow_id, [s.text for s in steps]):
                problems.append(why)
        return problems

    return body


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
    argv = [PREFECT, "--no-prompt", "worker", "start", "--pool", POOL, "--name", "bench-worker"]
    proc = spawn(argv, env, log)
    try:
        yield proc
    finally:
        # The worker and the flow runs it started (each in a session of its own).
        from bench._procmem import descendants

        for pid in [proc.pid, *descendants(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        proc.wait()


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``argv`` in a session of its own, in ``log``'s folder, its output into ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            cwd=log.parent,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@contextlib.contextmanager
def prefect_server(tmp: Path) -> Iterator[str]:
    """A ``prefect server`` of its own (no UI, no scheduler): its API URL.

    Not the test API of part 1, which is still recording that part's events. Its SQLite file
    is a copy of one Prefect's migrations already ran on: seconds of its start skipped.
    """
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    log = tmp / "server.log"
    database = tmp / "server.db"
    shutil.copyfile(migrated_sqlite(), database)
    env = cli_env(api, tmp / "server-home")
    env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{database}"
    argv = [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    proc = spawn([*argv, "--no-ui", "--no-scheduler"], env, log)
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


async def process_worker(sim: SimProcess, runs: int, limit: int, tmp: Path, api: str) -> Row:
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
    return Row(
        "worker",
        f"process worker, {limit} at once",
        runs,
        wall,
        peak,
        requests,
        runs - len(bad),
        problems,
        runs=runs,
    )


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


# -- report -----------------------------------------------------------------------------------------


def header() -> None:
    print(
        f"  {'how':<24} {'N':>4} {'wall s':>7} {'tail s':>6} {'steps/s':>8} {'CPU ms/step':>11} "
        f"{'helpers':>8} "
        f"{'peak RSS MiB':>14} {'Coder req/step':>14} {'API HTTP/step':>13} "
        f"{'events/step':>11} {'logs/step':>9} {'complete':>9} {'full GC':>9} {'stall s':>7}"
    )


def per_step(row: Row, count: int | None) -> str:
    return "-" if count is None else f"{count / row.steps:.2f}"


def row_line(row: Row, routes: bool = False) -> None:
    cpu = row.cpu_ms_per_step
    helpers = row.helpers_ms_per_step
    memory = f"{row.peak.rss / MIB:.0f}"
    if row.rss_start:
        memory += f" ({row.rss_start / MIB:.0f})"
    calls = row.calls
    print(
        f"  {row.how:<24} {row.workflows:>4} {row.wall:>7.2f} {row.tail:>6.1f} "
        f"{row.steps_per_second:>8.1f} {'-' if cpu is None else f'{cpu:.2f}':>11} "
        f"{'-' if helpers is None else f'{helpers:.2f}':>8} {memory:>14} "
        f"{row.requests / row.steps:>14.2f} "
        f"{per_step(row, calls.http if calls else None):>13} "
        f"{per_step(row, calls.events if calls else None):>11} "
        f"{per_step(row, calls.logs if calls else None):>9} "
        f"{row.complete:>5}/{row.workflows:<3} {pause_columns(row.pauses)}",
        flush=True,
    )
    if routes and calls is not None and calls.http:
        print(f"      API HTTP per step: {calls.top_routes(row.steps)}")
    for problem in row.problems[:5]:
        print(f"    not complete: {problem}")
    if len(row.problems) > 5:
        print(f"    ... and {len(row.problems) - 5} more")


def pause_columns(pauses: Pauses | None) -> str:
    """``2/0.41  0.30``: full collections and their seconds; the loop's longest stall."""
    if pauses is None:
        return ""
    collections = f"{pauses.full_collections}/{pauses.full_collection_seconds:.2f}"
    return f"{collections:>9} {pauses.longest_stall:>7.2f}"


def ratio(top: float | None, bottom: float | None) -> str:
    if top is None or not bottom:
        return "-"
    return f"{top / bottom:.2f}"


def ratios(size: int, rows: dict[str, Row]) -> None:
    print(f"  N={size}:")
    for top, bottom in (("c", "b"), ("c", "a"), ("c'", "b"), ("c'", "a"), ("b", "a")):
        if top not in rows or bottom not in rows:
            continue
        t, b = rows[top], rows[bottom]
        print(
            f"    {top + '/' + bottom:<5} wall {ratio(t.wall, b.wall):>6}   "
            f"CPU/step {ratio(t.cpu_ms_per_step, b.cpu_ms_per_step):>6}   "
            f"helpers/step {ratio(t.helpers_ms_per_step, b.helpers_ms_per_step):>6}   "
            f"Coder req/step {ratio(t.requests, b.requests):>6}   "
            f"API HTTP/step {ratio(t.calls.http if t.calls else None, b.calls.http if b.calls else None):>6}"
        )


def steadiness(rows: dict[str, list[Row]]) -> None:
    for kind, found in rows.items():
        walls = [r.wall for r in found]
        cpus = [r.cpu_ms_per_step or 0.0 for r in found]
        print(
            f"  {kind:<3} wall s: {', '.join(f'{w:.2f}' for w in walls)}; "
            f"slowest/fastest {max(walls) / min(walls):.2f}"
        )
        print(
            f"      CPU ms/step: {', '.join(f'{c:.2f}' for c in cpus)}; "
            f"most/least {max(cpus) / min(cpus):.2f}"
        )
        helpers = [r.helpers_ms_per_step or 0.0 for r in found]
        print(
            f"      helpers' CPU ms/step: {', '.join(f'{h:.2f}' for h in helpers)}; "
            f"tails s: {', '.join(f'{r.tail:.1f}' for r in found)}"
        )
        stalls = [r.pauses.long_stalls_seconds if r.pauses else 0.0 for r in found]
        print(
            "      the event loop stalled over 0.1 s for, s (full collections included): "
            + ", ".join(f"{x:.2f}" for x in stalls)
        )
    b, c = rows.get("b", []), rows.get("c", [])
    if b and c:  # each round's c beside the b that ran just before it
        rounds = list(zip(b, c, strict=True))
        walls = [y.wall / x.wall for x, y in rounds]
        cpus = [
            y.cpu_ms_per_step / x.cpu_ms_per_step
            for x, y in rounds
            if y.cpu_ms_per_step is not None and x.cpu_ms_per_step
        ]
        print(
            f"  c/b round by round, wall: {', '.join(f'{r:.2f}' for r in walls)}; "
            f"CPU/step: {', '.join(f'{r:.2f}' for r in cpus)}"
        )
        # The machine's speed drifts by more than the difference measured (this shared
        # host's rows of the same fleet move by 10-20% over minutes), so each c is set
        # beside the b run just before it, and the middle of those ratios is the figure.
        print(
            f"  c/b, median of the rounds: wall {statistics.median(walls):.2f}, "
            f"CPU/step {statistics.median(cpus) if cpus else float('nan'):.2f}"
        )


# -- main -------------------------------------------------------------------------------------------


@dataclass
class Setup:
    """What the rows share: the simulator, the two ledgers, and the failures so far."""

    sim: SimProcess
    sqlite: Any
    postgres: Any
    failed: list[str]
    #: Rows on a CPU of their own, their helpers on the others (``--no-pin``: shared).
    pin: bool = True

    def measure(self, kind: str, how: str, size: int, body: Body) -> Row:
        if self.pin:
            apart_from_helpers()  # again each row: helpers may have started processes
        row = measure(self.sim, kind, how, size, body)
        if row.problems:
            self.failed.append(f"{how} x{size}: {len(row.problems)} incomplete")
        return row


def sizes_part(setup: Setup, sizes: list[int], postgres_sizes: list[int]) -> None:
    sim = setup.sim
    # Warm-up, not reported: imports, first flow runs, the stores' schemas.
    for body in (bare(sim, 2), plain(sim, 2), durable(sim, 2, setup.sqlite)):
        measure(sim, "warm-up", "warm-up", 2, body)
    if postgres_sizes:
        measure(sim, "warm-up", "warm-up", 2, durable(sim, 2, setup.postgres))
    if not sizes:
        return
    print(f"\none process, N workflows of {len(PROMPTS)} turns at once (warmed up):")
    header()
    by_size: dict[int, dict[str, Row]] = {}
    for size in sizes:
        rows = by_size[size] = {}
        plan: list[tuple[str, str, Body]] = [
            ("a", "(a) bare ChatSession", bare(sim, size)),
            ("b", "(b) plain @task per turn", plain(sim, size)),
            ("c", "(c) durable_chats SQLite", durable(sim, size, setup.sqlite)),
        ]
        if size in postgres_sizes:
            plan.append(("c'", "(c') durable_chats PG", durable(sim, size, setup.postgres)))
        for kind, how, body in plan:
            rows[kind] = setup.measure(kind, how, size, body)
            row_line(rows[kind], routes=kind != "a")
        print(f"    {load()}")
    print("\nratios (wall time; CPU, Coder requests and Prefect API HTTP requests per step):")
    for size, rows in by_size.items():
        ratios(size, rows)


def repeat_part(setup: Setup, size: int, times: int) -> None:
    sim = setup.sim
    print(f"\nsteadiness: {times} runs each of (b) and (c) at N={size}, interleaved; {load()}")
    header()
    repeats: dict[str, list[Row]] = {"b": [], "c": []}
    for _ in range(times):
        for kind, how, body in (
            ("b", "(b) plain @task per turn", plain(sim, size)),
            ("c", "(c) durable_chats SQLite", durable(sim, size, setup.sqlite)),
        ):
            repeats[kind].append(setup.measure(kind, how, size, body))
            row_line(repeats[kind][-1])
    steadiness(repeats)
    print(f"    {load()}")


def worker_part(setup: Setup, tmp: Path, runs: int, limit: int) -> None:
    print(f"\n{runs} durable-chat flow runs on a process worker (pool concurrency limit {limit}):")
    with prefect_server(tmp) as api:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: api}):
            row = asyncio.run(process_worker(setup.sim, runs, limit, tmp, api))
    if row.problems:
        setup.failed.append(f"{row.how}: {len(row.problems)} incomplete")
    header()
    row_line(row)
    print(
        f"    peak PSS {row.peak.pss / MIB:.0f} MiB, peak {row.peak.processes} "
        f"flow-run processes, {row.wall / row.runs:.2f} s per run; {load()}"
    )


def parse_sizes(text: str, default: list[int]) -> list[int]:
    if text == "all":
        return default
    if text in ("", "none"):
        return []
    return [int(s) for s in text.split(",") if s]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,200,500", help="workflows per fleet")
    parser.add_argument(
        "--postgres-sizes",
        default="all",
        help="sizes that also run (c') on Postgres: 'all' (those of --sizes), 'none', or a list",
    )
    parser.add_argument("--repeat", type=int, default=5, help="(b) and (c) runs for steadiness")
    parser.add_argument("--repeat-size", type=int, default=200, help="workflows in those runs")
    parser.add_argument("--worker-runs", type=int, default=0, help="flow runs on the worker")
    parser.add_argument("--worker-limit", type=int, default=8, help="the pool's concurrency")
    parser.add_argument(
        "--dsn",
        default=os.environ.get("PREFECT_CODER_BENCH_POSTGRES_DSN") or DEFAULT_DSN,
        help="the Postgres server of (c') (a throwaway schema, dropped after)",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="let this process and its helpers share every CPU",
    )
    args = parser.parse_args()
    sizes = parse_sizes(args.sizes, [])
    postgres_sizes = parse_sizes(args.postgres_sizes, sizes)
    if postgres_sizes and (why := asyncio.run(postgres_reachable(args.dsn))):
        print(f"(c') skipped: Postgres is out of reach ({why})")
        postgres_sizes = []
    schema = f"bench_fleet_{uuid.uuid4().hex[:12]}"
    print(f"fleet: 3-turn workflows; the simulator in another process; at start {load()}")
    failed: list[str] = []
    try:
        with simulator_process() as sim, prefect_api() as tmp:
            from prefect_coder.blocks import PostgresLedger, SqliteLedger

            setup = Setup(
                sim,
                SqliteLedger(path=str(tmp / "fleet.sqlite3")),
                PostgresLedger(dsn=SecretStr(args.dsn), db_schema=schema),
                failed,
                pin=not args.no_pin,
            )
            print(apart_from_helpers() if setup.pin else "not pinned: every process on every CPU")
            sizes_part(setup, sizes, postgres_sizes)
            if args.repeat:
                repeat_part(setup, args.repeat_size, args.repeat)
            maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            print(f"\nru_maxrss of this process: {maxrss / MIB:.0f} MiB")
            if args.worker_runs:
                worker_part(setup, tmp, args.worker_runs, args.worker_limit)
    finally:
        if postgres_sizes:
            asyncio.run(drop_schema(args.dsn, schema))
    print(f"\nat end {load()}")
    if failed:
        raise SystemExit("some workflows did not answer their 3 turns: " + "; ".join(failed))
    print("every workflow answered its 3 turns")


if __name__ == "__main__":
    main()
