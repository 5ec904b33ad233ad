"""What a durable step costs beside a bare Prefect task with a persisted result.

Run: ``python -m bench.durable_step [--steps 200] [--dsn postgresql://…]``.

Everything is measured in one run, in one flow run of Prefect's test API (a
temporary server in a subprocess), against the simulator in another process
(``bench._simproc``, deltas not paced). Each variant is timed per call from the
flow, the way ``DurableChat.turn`` calls ``run_turn`` (``return_state=True``,
then the state's result), in rounds of ``--chunk`` calls that rotate through the
variants, so that drift in the machine's load is shared out:

- **persisted task**: ``@task(persist_result=True)`` returning a small pydantic
  model (the bar);
- **run_turn's task, empty body**: a task with ``run_turn``'s options (the same
  ``durable_task`` with the same cache key) and parameters, whose body only builds a
  ``StepResult``: Prefect's bookkeeping for that signature;
- **ChatSession turn**: a bare turn on one chat, its own client (no store, no Prefect);
- **persisted task making the turn**: the bar's task with a bare turn in its body
  (Prefect and the turn, without durability);
- **run_step**: the durable layer alone (store reads, the journal write, the turn,
  the step's commit), no Prefect, on the SQLite and the Postgres store;
- **run_turn body**: ``run_turn.fn`` called in the flow: the task's body with its
  run logger, blocks and transport logging, but no task run;
- **durable step**: the ``run_turn`` task, SQLite ledger and Postgres ledger, each turn's
  story told in its task run's log (the default), and again with ``tell_turns`` off.

Each durable variant runs its own workflow, whose chat the warm-up's first step
created and checkpointed, so every measured step is a step on an already
checkpointed chat. Requests per step come from the simulator's request log (its
admin routes are not counted); commits per step from the shared store's
``commits``, and of those the ones flushed to disk before returning (``flushes``); CPU per step is this process's CPU time (every thread: Prefect ships
logs and events from background threads) over a variant's rounds. Last, the
pieces ``run_turn``'s body adds to ``run_step`` are timed one by one.

The flow runs on a CPU of its own and the processes the benchmark started (Prefect's
server, the simulator) on the others (``--no-pin``: every process on every CPU): what a
step costs is the worker's time, and the server recording one variant's logs would
otherwise take turns with the next variant being measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import inspect
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from prefect import flow, get_run_logger, task
from prefect.client.schemas.objects import State
from prefect.states import Completed
from pydantic import BaseModel, SecretStr

from bench._common import Latency, drop_schema, latency, load, prefect_api, requests_served
from bench._procmem import apart_from_helpers
from bench._simproc import SimProcess, simulator_process
from coder_chat import ChatClient, ChatSession
from coder_chat.client.events import HttpResponse, TransportEvent, WsEvent
from coder_chat.durable.context import StepContext, StepTools
from coder_chat.durable.records import Fence
from coder_chat.durable.step import StepResult, StepSpec, run_step
from coder_chat.durable.store import DurableStore
from prefect_coder import DurableChat
from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
from prefect_coder.operations import Runtime
from prefect_coder.settings import WorkflowSettings
from prefect_coder.tasks.turns import run_turn, step_cache_key

WARMUP = 5
DEFAULT_DSN = "postgresql://127.0.0.1:5432/test"


@dataclass
class Variant:
    name: str
    call: Callable[[int], Awaitable[None]]
    #: The store whose commits count for this variant, if any.
    store: DurableStore | None = None
    samples: list[float] = field(default_factory=list)
    requests: int = 0
    store_commits: int = 0
    store_flushes: int = 0
    calls: int = 0
    #: CPU seconds of this process (every thread) spent in this variant's rounds.
    cpu: float = 0.0


async def timed_rounds(variants: list[Variant], sim: SimProcess, steps: int, chunk: int) -> None:
    """Warm each variant up, then run ``steps`` calls of each in rotating rounds."""
    for variant in variants:
        for i in range(WARMUP):
            await variant.call(-1 - i)
    done = 0
    rotation = 0
    while done < steps:
        n = min(chunk, steps - done)
        order = variants[rotation % len(variants) :] + variants[: rotation % len(variants)]
        for variant in order:
            before = await asyncio.to_thread(requests_served, sim)
            store = variant.store
            commits, flushes = (store.commits, store.flushes) if store else (0, 0)
            cpu = time.process_time()
            for i in range(done, done + n):
                t0 = time.perf_counter()
                await variant.call(i)
                variant.samples.append(time.perf_counter() - t0)
            variant.cpu += time.process_time() - cpu
            variant.requests += await asyncio.to_thread(requests_served, sim) - before
            if store:
                variant.store_commits += store.commits - commits
                variant.store_flushes += store.flushes - flushes
            variant.calls += n
        done += n
        rotation += 1


class Small(BaseModel):
    index: int
    text: str


@task(persist_result=True)
async def persisted(index: int) -> Small:
    """The bar: a bare task whose small pydantic result Prefect persists."""
    return Small(index=index, text=f"answer {index}")


#: The session ``turn_task`` turns on (a task parameter would be hashed for the cache key).
_SESSIONS: dict[str, ChatSession] = {}


@task(persist_result=True)
async def turn_task(index: int) -> Small:
    """The same task, making a bare turn: Prefect plus the turn, without durability."""
    result = await _SESSIONS["turn task"].generate(f"turn {index}")
    return Small(index=index, text=result.text)


@functools.wraps(run_turn.fn)  # run_turn's signature, so Prefect sees the same parameters
async def _nothing(*args: Any, **kwargs: Any) -> State[StepResult]:
    """``run_turn``'s parameters, and a body that does nothing (its state says so, as
    ``run_turn``'s says its verdict)."""
    bound = inspect.signature(run_turn.fn).bind(*args, **kwargs).arguments
    run = bound["run"]
    result = StepResult(
        workflow_id=run.workflow_id, step=bound["step"], text="", chat_id="-", verdict="ran"
    )
    return Completed(data=result, message="nothing done")


#: ``run_turn``'s options (its retries, name pattern, cache key and persisted result).
shell = task(
    name="run-turn-shell",
    task_run_name=cast(str, run_turn.task_run_name),
    retries=run_turn.retries,
    retry_delay_seconds=run_turn.retry_delay_seconds,
    retry_condition_fn=run_turn.retry_condition_fn,
    cache_key_fn=step_cache_key,
    persist_result=True,
    result_serializer="json",
)(_nothing)


async def result_of(call: Any) -> Any:
    """Await a task called with ``return_state=True``, then its result (as the flows do)."""
    state = await cast(Awaitable[State[Any]], call)
    return await state.aresult()


@dataclass
class Measured:
    """One variant's workflow, as its run holds it, and its next step."""

    chat: DurableChat
    step: int = 0

    def next(self) -> int:
        self.step += 1
        return self.step


@dataclass
class Setup:
    sim: SimProcess
    credentials: CoderCredentials
    sqlite: SqliteLedger
    postgres: PostgresLedger
    settings: WorkflowSettings
    #: The step count shown in task run names.
    steps: int
    #: The variants' workflows, held open (begun) until the measuring flow ends.
    held: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    @property
    def tenant(self) -> str:
        return self.sim.organization_id

    @classmethod
    def make(cls, sim: SimProcess, tmp: str, dsn: str, schema: str, steps: int) -> Setup:
        return cls(
            sim,
            CoderCredentials(
                base_url=sim.base_url,
                token=SecretStr(sim.token),
                organization_id=sim.organization_id,
            ),
            SqliteLedger(path=os.path.join(tmp, "ledger.sqlite3")),
            PostgresLedger(dsn=SecretStr(dsn), db_schema=schema),
            WorkflowSettings(),
            WARMUP + steps,
        )

    async def workflow(
        self,
        ledger: SqliteLedger | PostgresLedger,
        name: str,
        settings: WorkflowSettings | None = None,
    ) -> Measured:
        """A workflow begun by ``DurableChat`` (its epoch taken, its run built), one of
        the flow run's many (it names no run), held open until :attr:`held` closes."""
        chat = DurableChat(
            f"bench-{name}-{uuid.uuid4().hex[:8]}",
            credentials=self.credentials,
            ledger=ledger,
            settings=settings or self.settings,
            expected_turns=self.steps,
            owns_run=False,
        )
        return Measured(await self.held.enter_async_context(chat))

    def session(self) -> ChatSession:
        sim = self.sim
        return ChatSession.connect(sim.base_url, sim.token, sim.organization_id)

    def turn(self, wf: Measured, how: str) -> Callable[[int], Awaitable[None]]:
        """A call of ``run_turn`` (``how``: ``task``, or ``body`` for ``run_turn.fn``) or of
        the empty ``shell`` task, for the next step of ``wf``."""

        async def call(i: int) -> None:
            step = wf.next()
            kwargs: dict[str, Any] = {"run": wf.chat.run, "step": step, "prompt": f"step {step}"}
            if how == "body":
                result = cast(StepResult, (await run_turn.fn(**kwargs)).data)
            else:
                target = shell if how == "shell" else run_turn
                result = await result_of(target(**kwargs, return_state=True))
            assert result.verdict == "ran", result

        return call

    def step(
        self, client: ChatClient, store: DurableStore, wf: Measured
    ) -> Callable[[int], Awaitable[None]]:
        """``run_step`` for the next step of ``wf``: the durable layer alone."""

        async def call(i: int) -> None:
            step = wf.next()
            wid = wf.chat.workflow_id
            fence = Fence(tenant=self.tenant, workflow_id=wid, epoch=wf.chat.run.fence.epoch)
            options = self.settings.options()
            ctx = StepContext.fenced(client, store, fence, wid, step, StepTools(), options)
            result = await run_step(ctx, StepSpec(prompt=f"step {step}"))
            assert result.verdict == "ran", result

        return call


async def build_variants(setup: Setup) -> list[Variant]:
    sqlite_store = setup.sqlite.get_store()
    postgres_store = setup.postgres.get_store()
    session = setup.session()
    _SESSIONS["turn task"] = setup.session()
    # The durable layer alone: its own client (no transport logging), the shared store.
    bare_client = ChatClient(base_url=setup.sim.base_url, token=setup.sim.token)

    async def persisted_call(i: int) -> None:
        assert (await result_of(persisted(i, return_state=True))).index == i

    async def session_call(i: int) -> None:
        assert (await session.generate(f"turn {i}")).text

    async def turn_task_call(i: int) -> None:
        assert (await result_of(turn_task(i, return_state=True))).text

    async def wf(
        ledger: SqliteLedger | PostgresLedger, name: str, settings: WorkflowSettings | None = None
    ) -> Measured:
        return await setup.workflow(ledger, name, settings)

    quiet = WorkflowSettings(tell_turns=False)

    sqlite, postgres = setup.sqlite, setup.postgres
    return [
        Variant("persisted task", persisted_call),
        Variant(
            "run_turn's task, empty body",
            setup.turn(await wf(sqlite, "shell"), "shell"),
            sqlite_store,
        ),
        Variant("ChatSession turn", session_call),
        Variant("persisted task making the turn", turn_task_call),
        Variant(
            "run_step, SQLite",
            setup.step(bare_client, sqlite_store, await wf(sqlite, "step-sqlite")),
            sqlite_store,
        ),
        Variant(
            "run_step, Postgres",
            setup.step(bare_client, postgres_store, await wf(postgres, "step-pg")),
            postgres_store,
        ),
        Variant(
            "run_turn body, SQLite",
            setup.turn(await wf(sqlite, "body"), "body"),
            sqlite_store,
        ),
        Variant(
            "durable step, SQLite",
            setup.turn(await wf(sqlite, "sqlite"), "task"),
            sqlite_store,
        ),
        Variant(
            "durable step, Postgres",
            setup.turn(await wf(postgres, "pg"), "task"),
            postgres_store,
        ),
        Variant(
            "durable step, SQLite, untold",
            setup.turn(await wf(sqlite, "sqlite-untold", quiet), "task"),
            sqlite_store,
        ),
        Variant(
            "durable step, Postgres, untold",
            setup.turn(await wf(postgres, "pg-untold", quiet), "task"),
            postgres_store,
        ),
    ]


@dataclass
class Piece:
    name: str
    samples: list[float]
    per_step: float  # how many times a durable step pays it


async def pieces(setup: Setup, n: int) -> list[Piece]:
    """Time, one by one, what ``run_turn``'s body does besides ``run_step``, in the flow."""
    sim, credentials, ledger = setup.sim, setup.credentials, setup.sqlite

    # How many transport events (stream traffic aside) a turn on a checkpointed chat makes.
    events: list[TransportEvent] = []
    async with ChatClient(
        base_url=sim.base_url, token=sim.token, on_transport_event=events.append
    ) as client:
        session = ChatSession(client=client, organization_id=sim.organization_id)
        await session.generate("first")
        events.clear()
        for i in range(10):
            await session.generate(f"count {i}")
    per_turn = sum(1 for e in events if not isinstance(e, WsEvent)) / 10
    sample = HttpResponse(
        op="send_message",
        method="POST",
        path="/api/v2/chats/x/messages",
        status=200,
        duration=0.001,
    )
    log = get_run_logger()
    # The process's shared client, made with our transport logging (``emit`` calls it).
    shared = Runtime.from_blocks(credentials, ledger).client

    def timed(call: Callable[[], object]) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            call()
            out.append(time.perf_counter() - t0)
        return out

    return [
        Piece("CoderCredentials.resolved()", timed(credentials.resolved), 2),
        Piece(
            "Runtime.from_blocks(credentials, ledger), all of it",
            timed(lambda: Runtime.from_blocks(credentials, ledger)),
            1,
        ),
        Piece("get_run_logger() (the run's logger, ours built on it)", timed(get_run_logger), 1),
        Piece(
            f"transport event, logged ({per_turn:.0f} events a turn)",
            timed(lambda: shared.emit(sample)),
            per_turn,
        ),
        # What a line of the step's own would cost: its verdict rides on Prefect's last
        # line of the task run instead (its Completed state's message), so none is paid.
        Piece("one INFO line (console and API; none now)", timed(lambda: log.info("line")), 0),
    ]


def report_pieces(found: list[Piece], body_minus_step: float) -> None:
    print("\n  run_turn's body besides run_step, timed piece by piece in the same flow:")
    print(f"    {'piece':<52} {'p50 ms':>8} {'x per step':>10} {'ms a step':>10}")
    total = 0.0
    for piece in found:
        p50 = latency(piece.samples).p50_ms
        if piece.name.startswith("CoderCredentials"):
            share = "(in runtime)"
        else:
            total += p50 * piece.per_step
            share = f"{p50 * piece.per_step:>10.2f}"
        print(f"    {piece.name:<52} {p50:>8.3f} {piece.per_step:>10.0f} {share:>10}")
    print(
        f"    {'sum of the pieces':<52} {'':>8} {'':>10} {total:>10.2f}"
        f"\n    {'run_turn body minus run_step (p50s, above)':<52} {'':>8} {'':>10} "
        f"{body_minus_step:>10.2f}"
    )


def report(variants: list[Variant]) -> None:
    stats: dict[str, Latency] = {v.name: latency(v.samples) for v in variants}
    bar = stats["persisted task"].p50_ms
    print(
        f"\n  {'per step':<30} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'cpu ms':>7} "
        f"{'requests':>9} {'commits':>8} {'flushed':>8} {'x bar p50':>10}"
    )
    for v in variants:
        s = stats[v.name]
        print(
            f"  {v.name:<30} {s.p50_ms:>8.2f} {s.p99_ms:>8.2f} {s.mean_ms:>8.2f} "
            f"{v.cpu / v.calls * 1000:>7.2f} "
            f"{v.requests / v.calls:>9.2f} {v.store_commits / v.calls:>8.2f} "
            f"{v.store_flushes / v.calls:>8.2f} "
            f"{s.p50_ms / bar:>10.2f}"
        )

    def p50(name: str) -> float:
        return stats[name].p50_ms

    print("\n  where a durable step's p50 goes (differences of p50s, SQLite ledger):")
    split = [
        ("the turn (bare ChatSession)", p50("ChatSession turn")),
        (
            "durable layer: store reads, journal, step commit",
            p50("run_step, SQLite") - p50("ChatSession turn"),
        ),
        (
            "task body's Prefect side: run logger, blocks, transport logs",
            p50("run_turn body, SQLite") - p50("run_step, SQLite"),
        ),
        (
            "task run: orchestration, cache key, result persisted",
            p50("durable step, SQLite") - p50("run_turn body, SQLite"),
        ),
    ]
    for label, ms in split:
        print(f"    {label:<62} {ms:>7.2f} ms")
    print(f"    {'sum (the durable step, SQLite)':<62} {p50('durable step, SQLite'):>7.2f} ms")
    shell = p50("run_turn's task, empty body") - p50("persisted task")
    print(
        f"    {'of which: run_turn-shaped empty task minus the persisted task':<62} {shell:>7.2f} ms"
    )
    print(
        f"\n  ratio, durable step p50 / persisted task p50, each turn's story told: SQLite "
        f"{p50('durable step, SQLite') / bar:.2f}, Postgres {p50('durable step, Postgres') / bar:.2f}"
        ""
    )
    print(
        f"  the same, the story not told (tell_turns off): SQLite "
        f"{p50('durable step, SQLite, untold') / bar:.2f}, Postgres "
        f"{p50('durable step, Postgres, untold') / bar:.2f}"
    )
    turn = p50("persisted task making the turn")
    for told, suffix in (("told", ""), ("not told", ", untold")):
        print(
            f"  ratio, durable step p50 / persisted task making the same turn p50, the story "
            f"{told}: SQLite {p50('durable step, SQLite' + suffix) / turn:.2f}, Postgres "
            f"{p50('durable step, Postgres' + suffix) / turn:.2f} (the bars: 1.2 and 1.5)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="measured steps per variant")
    parser.add_argument("--chunk", type=int, default=10, help="calls per variant per round")
    parser.add_argument(
        "--dsn",
        default=os.environ.get("PREFECT_CODER_BENCH_POSTGRES_DSN") or DEFAULT_DSN,
        help="the Postgres server of the Postgres ledger (a throwaway schema, dropped after)",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave every process on every CPU (by default the flow runs on a CPU of its own)",
    )
    args = parser.parse_args()
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    print(f"durable step: {args.steps} steps per variant after {WARMUP} warm-up, in rounds of")
    print(f"{args.chunk}; the simulator in another process, Prefect's test API in another.")
    print(f"  at start: {load()}")
    variants: list[Variant] = []
    found: list[Piece] = []
    try:
        with simulator_process() as sim, prefect_api() as tmp:
            setup = Setup.make(sim, str(tmp), args.dsn, schema, args.steps)
            print(f"  {'not pinned' if args.no_pin else apart_from_helpers()}")

            @flow(name="durable-step-bench")
            async def bench() -> None:
                async with setup.held:
                    variants.extend(await build_variants(setup))
                    await timed_rounds(variants, sim, args.steps, args.chunk)
                    found.extend(await pieces(setup, args.steps))

            asyncio.run(bench())
            print(f"  at end:   {load()}")
    finally:
        asyncio.run(drop_schema(args.dsn, schema))
    report(variants)
    stats = {v.name: latency(v.samples).p50_ms for v in variants}
    report_pieces(found, stats["run_turn body, SQLite"] - stats["run_step, SQLite"])


if __name__ == "__main__":
    main()
