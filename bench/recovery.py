"""How soon a crashed workflow is relaunched, from the shipped deployment YAML.

A real ``prefect server`` (no scheduler: only the sweep's triggers start a pass), ``prefect
deploy --all`` from deployments/prefect.yaml, ``prefect-coder simulator``, a process worker
(``PREFECT_WORKER_QUERY_SECONDS=2``, as the README says). Each try launches durable-chat with
one step whose turn sleeps on the simulator, waits until the step is under way, then:

- ``worker``: SIGKILLs the worker and every flow run it started (every process group in its
  tree, as a host dies) and starts a new worker at once, as a supervisor would. Nobody
  reports the run: its Prefect heartbeats stop, and the sweep's silent trigger fires;
- ``flow-run``: SIGKILLs the flow run's process group alone; the worker reports it Crashed,
  and the sweep's crash trigger fires.

Measured from the kill: until the relaunch run is created (Prefect's ``created``), and until
the relaunched run takes the workflow's next epoch in the store (its first durable act).
Each relaunch is let finish before the next try.

What it measures, it checks: a try fails unless the relaunch finished the workflow and the
killed run ended Superseded; a flow-run try unless the crash trigger's pass relaunched it; a
worker try unless the run's stopped pulse was known first (the pulse trigger's pass, told
the run, marked it Crashed; Prefect's own heartbeat, 30 s at best, plays no part). And no
relaunch that finished started a pass by its silence after its end (it said it stopped).

Beside them, the clock alone (the 5-minute schedule with a 120 s stale heartbeat), from the
configuration, not measured.

    python -m bench.recovery [--tries 10] [--only worker|flow-run]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterTags,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun, StateType

from bench._common import load
from tests.integration.procs import managed_processes, until
from tests.integration.recovery_stack import (
    WORKER_QUERY_SECONDS,
    Stack,
    new_workflow_id,
    recovery_stack,
    sweep_runs,
    wait_ended,
)

#: The killed step's turn: long enough that the kill lands in it.
PROMPT = "/sleep 12 take your time"
#: Give up on one try after this long (the clock alone would take minutes).
TRY_TIMEOUT = 120.0
#: The shipped YAML's trigger on a run's Crashed (or Cancelled) state.
CRASH_TRIGGER = "orphan-sweep on a crash or a cancel"
#: The shipped YAML's trigger on a run whose pulse stopped.
PULSE_TRIGGER = "orphan-sweep on a run whose pulse stopped"


async def one_try(stack: Stack, kind: str, finished: list[uuid.UUID]) -> tuple[float, float]:
    """(seconds to the relaunch run's creation, seconds to its new epoch); prints where
    the seconds went (Prefect's record of the dead run and of the sweep that relaunched it).
    The relaunch, once it finished the workflow, is added to ``finished``."""
    client = stack.client
    if not any(w.running for w in stack.workers):
        await stack.start_worker()
    worker = stack.worker
    workflow_id = new_workflow_id(f"bench-{kind}")
    run = await stack.launch(workflow_id, [PROMPT])
    await stack.began(workflow_id, 1, 180.0)
    await stack.pulsing(run.id, 180.0)
    await asyncio.sleep(1.0)  # the turn is sent and sleeping on the simulator
    if kind == "worker":
        killed = await stack.kill_worker(worker)
        await stack.start_worker()
    else:
        killed = await stack.kill_flow_run(worker)
    await stack.began(workflow_id, 2, TRY_TIMEOUT)
    took_epoch = time.time() - killed
    tag = f"prefect-coder:relaunch:{workflow_id}"

    async def relaunched() -> FlowRun | None:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag]))
        )
        return runs[0] if runs else None

    relaunch = await until(relaunched, "the relaunch run", 30.0, [])
    assert relaunch.created is not None
    created = relaunch.created.timestamp() - killed
    # Log lines reach the API a little after they are said: read until the pass's is there.
    trigger = await until(
        lambda: relaunching_trigger(client, workflow_id, killed), "the pass's log", 30.0, []
    )
    if kind == "flow-run":  # the worker said Crashed: that event, not a pulse, was first
        assert trigger == CRASH_TRIGGER, trigger
    else:  # nobody said anything: the run's pulse stopped
        await known_by_its_stopped_pulse(client, run.id, killed)
    done = await wait_ended(client, relaunch.id, 180.0)
    assert done.state is not None and done.state.type == StateType.COMPLETED, done.state
    finished.append(relaunch.id)
    dead = await client.read_flow_run(run.id)
    assert dead.state is not None and dead.state.name == "Superseded", dead.state
    print(f"          {await stages(client, run.id, killed, relaunch)} · by {trigger!r}")
    return created, took_epoch


async def relaunching_trigger(client: PrefectClient, workflow_id: str, killed: float) -> str | None:
    """The trigger whose sweep pass relaunched the workflow (``None``: no pass's log says
    so yet). Every pass here is one a trigger made (the server runs no scheduler): a try
    the clock answered would measure the wrong thing, and fails; so does a workflow two
    passes relaunched. A pass the crash trigger made was told the event, in its
    ``because`` and its log."""
    passes = await passes_since(client, killed)
    relaunched_by = []
    for sweep in passes:
        assert sweep.created_by is not None and sweep.created_by.type == "AUTOMATION", sweep
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[sweep.id]))
        )
        said = [log.message for log in logs]
        if any(f"Relaunched workflow {workflow_id}" in line for line in said):
            relaunched_by.append((sweep, said))
    if not relaunched_by:
        return None
    assert len(relaunched_by) == 1, [s.name for s, _ in relaunched_by]
    [(sweep, said)] = relaunched_by
    trigger = str(sweep.created_by.display_value if sweep.created_by else "")
    if trigger == CRASH_TRIGGER:
        assert sweep.parameters["because"].startswith("prefect.flow-run.Crashed of run ")
        assert any("prefect.flow-run.Crashed" in line for line in said), said
    return trigger


async def passes_since(client: PrefectClient, killed: float) -> list[FlowRun]:
    """The sweep passes made after the kill."""
    return [r for r in await sweep_runs(client) if r.created and r.created.timestamp() > killed]


async def known_by_its_stopped_pulse(client: PrefectClient, run: uuid.UUID, killed: float) -> None:
    """A pass the pulse trigger made after the kill was told the run, and the run was marked
    Crashed for its stopped pulse. On a loaded machine a pass of Prefect's heartbeat trigger
    may come too (a heartbeat late while the run lived): the pulse's pass is looked for."""
    passes = await passes_since(client, killed)
    by_pulse = [p for p in passes if p.created_by and p.created_by.display_value == PULSE_TRIGGER]
    assert by_pulse, [(p.created_by, p.parameters.get("because")) for p in passes]
    told = by_pulse[0].parameters
    assert told["because"].startswith("no pulse from run "), told
    assert told["silent_flow_run"] == f"prefect.flow-run.{run}", told
    crashed = [s for s in await client.read_flow_run_states(run) if s.type == StateType.CRASHED]
    assert crashed and "went silent (no pulse from run" in (crashed[0].message or ""), crashed


async def no_pass_for_their_silence(client: PrefectClient, finished: list[uuid.UUID]) -> None:
    """A run that finished its workflow said it stopped pulsing: its silence afterwards (for
    as long as the later tries ran) started no pass."""
    names = {f"prefect.flow-run.{run}" for run in finished}
    told = [
        p.name for p in await sweep_runs(client) if p.parameters.get("silent_flow_run") in names
    ]
    assert not told, f"passes told a finished run went silent: {told}"


async def stages(client: PrefectClient, dead: uuid.UUID, killed: float, relaunch: FlowRun) -> str:
    """When, after the kill, Prefect knew (the dead run Crashed), the first sweep pass after
    it was made and began running, and the relaunch was made."""
    marks: list[str] = []
    states = await client.read_flow_run_states(dead)
    crashed = [s for s in states if s.type == StateType.CRASHED and s.timestamp is not None]
    if crashed:
        marks.append(f"crashed {crashed[0].timestamp.timestamp() - killed:5.1f}")
    sweeps = await passes_since(client, killed)
    if sweeps:
        first = sweeps[0]
        assert first.created is not None
        marks.append(f"sweep made {first.created.timestamp() - killed:5.1f}")
        if first.start_time is not None:
            marks.append(f"sweep running {first.start_time.timestamp() - killed:5.1f}")
    assert relaunch.created is not None
    marks.append(f"relaunch made {relaunch.created.timestamp() - killed:5.1f}")
    return " · ".join(marks)


def line(label: str, values: list[float]) -> str:
    ordered = sorted(values)
    return (
        f"  {label:<34} p50 {statistics.median(ordered):6.1f} s   max {ordered[-1]:6.1f} s"
        f"   (n={len(ordered)}: {', '.join(f'{v:.1f}' for v in ordered)})"
    )


async def main(tries: int, kinds: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        root = Path(tmp)
        async with managed_processes(root) as procs, recovery_stack(procs, root) as stack:
            await stack.start_worker()
            results: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
            finished: list[uuid.UUID] = []
            for kind in kinds:
                for n in range(tries):
                    created, epoch = await one_try(stack, kind, finished)
                    results[kind].append((created, epoch))
                    print(
                        f"{kind:>8} try {n + 1}: relaunch made {created:5.1f} s, epoch {epoch:5.1f} s"
                    )
            await no_pass_for_their_silence(stack.client, finished)
    print()
    print(f"Recovery from the shipped YAML ({load()}; worker query every {WORKER_QUERY_SECONDS} s)")
    titles = {
        "worker": "worker SIGKILLed with its flow runs (host dies; a new worker started at once)",
        "flow-run": "flow-run process SIGKILLed alone (the worker reports Crashed)",
    }
    for kind in kinds:
        print(titles[kind])
        print(line("kill -> relaunch run created", [c for c, _ in results[kind]]))
        print(line("kill -> relaunch takes the epoch", [e for _, e in results[kind]]))
    print(
        "clock alone (triggers removed; from the configuration, not measured): relaunched at "
        "the first 5-minute tick after the heartbeat is 120 s stale: 90-420 s after the kill, "
        "about 255 s on average"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--only", choices=["worker", "flow-run"])
    args = parser.parse_args()
    asyncio.run(main(args.tries, [args.only] if args.only else ["flow-run", "worker"]))
