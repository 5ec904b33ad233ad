"""Playing one schedule on a running fleet, from the first launch to a quiet fleet.

1. Each workflow is launched (from the ``durable-chat`` deployment, on its queue)
   at its time, and each fault plays on its own (:mod:`.faults`), as does each
   person's action (:mod:`.people`).
2. The schedule waits for every workflow to end in the store (finished, or failed
   for good) and every person to be done, then cancels what is left of the faults
   (each heals what it broke).
3. It waits for the fleet to go quiet: every flow run of these workflows over
   (ended in Prefect, or its processes gone), including a run that was cut off
   and came back after its successor took over.
4. If a chat of these workflows is left unarchived, it waits for a sweep that
   began once that chat was old enough to be an orphan, and for that sweep to end.

Every limit here bounds the lab's own waiting; what the invariants allow is
judged afterwards (:mod:`.checks`), from the records.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import httpx
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.states import Crashed

from coder_chat.durable.store import DurableStore
from tests.lab.tasks import cancel_all

from .config import DURABLE_CHAT, Timings
from .faults import END_FALLBACK, FaultRecord, Injector
from .fleet import Fleet
from .observe import Observer, Progress
from .people import PersonRecord, act
from .plan import FleetSchedule, FleetWorkflow
from .runs import deployment_runs, ended, parameters
from .truth import read_truth

POLL = 1.0
#: A run whose processes were seen this recently is alive.
ALIVE = 3.0
#: A sweep run with no live process for this long is stuck.
STUCK = 60.0
#: While the lab waits for a phase, it says what it waits on this often (a campaign
#: stopped by a signal, or by a test's time limit, leaves that behind).
TELL_EVERY = 60.0


@dataclass(frozen=True)
class Limits:
    """How long the lab waits for each phase before it stops waiting (and says so)."""

    work: float = 600.0
    quiet: float = 120.0
    sweep: float = 150.0
    #: How long a fault whose end is an event (a successor's epoch) lasts if it never comes.
    fault_end: float = END_FALLBACK


DEFAULT_LIMITS = Limits()


#: Beyond two sweep passes, for a lost run's relaunch to be made.
SLACK_LOST = 10.0


@dataclass
class Played:
    schedule: FleetSchedule
    started: datetime
    faults: list[FaultRecord] = field(default_factory=list)
    people: list[PersonRecord] = field(default_factory=list)
    launched: dict[str, str] = field(default_factory=dict)
    all_ended: datetime | None = None
    notes: list[str] = field(default_factory=list)
    #: Runs the lab killed, still going after the quiet limit: no check judges their end.
    silenced: list[str] = field(default_factory=list)


async def play(
    fleet: Fleet, schedule: FleetSchedule, store: DurableStore, limits: Limits = DEFAULT_LIMITS
) -> Played:
    assert fleet.witness is not None and fleet.coder is not None
    ids = [w.workflow_id for w in schedule.workflows]
    observer = Observer(store, fleet.coder.organization_id, ids, fleet.witness)
    played = Played(schedule, datetime.now(UTC))
    watching = asyncio.create_task(observer.watch())
    injector = Injector(fleet, observer, time.monotonic(), limits.fault_end)
    faults = [asyncio.create_task(injector.play(f)) for f in schedule.faults]
    played.people = [
        PersonRecord(w.workflow_id, w.person) for w in schedule.workflows if w.person is not None
    ]
    by_id = {w.workflow_id: w for w in schedule.workflows}
    people = [
        asyncio.create_task(act(fleet, observer, by_id[r.workflow_id], injector.started, r))
        for r in played.people
    ]
    try:
        await asyncio.gather(*(_launch(fleet, w, played) for w in schedule.workflows))
        await _wait(
            lambda: _work_over(observer, played, fleet.timings, people),
            limits.work,
            "work",
            played,
            fleet.say,
            observer.describe,
        )
        played.all_ended = datetime.now(UTC)
    finally:
        # The faults still pending are cancelled: each heals what it broke on the way out.
        await cancel_all(faults)
        played.faults = injector.records
        await _stop_people(people, played)
        await _restart_dead_workers(fleet, played)
        await cancel_all([watching])
    await _wait(lambda: _quiet(fleet, played), limits.quiet, "quiet", played, fleet.say)
    await _silence(fleet, played)
    await _wait(lambda: _settled(played), limits.quiet, "runs settled", played, fleet.say)
    await _free_stuck_sweeps(fleet, played)
    await _wait(lambda: _swept(fleet, played), limits.sweep, "sweep", played, fleet.say)
    return played


async def _launch(fleet: Fleet, workflow: FleetWorkflow, played: Played) -> None:
    await asyncio.sleep(workflow.launch_at)
    async with get_client() as client:
        deployment = await client.read_deployment_by_name(DURABLE_CHAT)
        run = await client.create_flow_run_from_deployment(
            deployment.id,
            parameters=parameters(workflow, fleet.timings),
            work_queue_name=workflow.queue,
        )
    played.launched[workflow.workflow_id] = str(run.id)


async def _work_over(
    observer: Observer,
    played: Played,
    timings: Timings,
    people: list[asyncio.Task[None]],
) -> bool:
    """Every person is done, and every workflow ended in the store, or lost before the
    store heard of it."""
    if not all(p.done() for p in people):
        return False
    ids = observer.workflow_ids
    unbegun = [i for i in ids if observer.progress.get(i, Progress()).record is None]
    lost = await _lost(played, unbegun, timings) if unbegun else set()
    return all(observer.ended(i) or i in lost for i in ids)


async def _lost(played: Played, unbegun: list[str], timings: Timings) -> set[str]:
    """Workflows the store never heard of whose every flow run ended long enough ago
    that the sweep's relaunch of lost runs had its chance (two passes after the last
    one ended): nothing will run them again."""
    async with get_client() as client:
        runs = await deployment_runs(client, "durable-chat", played.started - timedelta(minutes=1))
    chance = timedelta(seconds=2 * timings.sweep_interval + SLACK_LOST)
    now, lost = datetime.now(UTC), set()
    for workflow_id in unbegun:
        theirs = [r for r in runs if r.parameters.get("workflow_id") == workflow_id]
        ends = [r.end_time or r.state.timestamp for r in theirs if ended(r) and r.state]
        if theirs and len(ends) == len(theirs) and all(e and now - e > chance for e in ends):
            lost.add(workflow_id)
    return lost


async def _wait(
    probe: Callable[[], Awaitable[bool]],
    limit: float,
    phase: str,
    played: Played,
    say: Callable[[str], None],
    status: Callable[[], str] = lambda: "",
) -> None:
    started = time.monotonic()
    give_up, tell_at = started + limit, started + TELL_EVERY
    while time.monotonic() < give_up:
        # A probe that reads Prefect's API while a fault restarts its server asks again.
        with contextlib.suppress(httpx.TransportError):
            if await probe():
                return
        await asyncio.sleep(POLL)
        if time.monotonic() >= tell_at:
            tell_at += TELL_EVERY
            waited, now = time.monotonic() - started, status()
            say(
                f"schedule {played.schedule.name}: {waited:.0f}s into the {phase} phase"
                + (f": {now}" if now else "")
            )
    played.notes.append(f"stopped waiting for the {phase} phase after {limit:.0f}s")


async def _stop_people(people: list[asyncio.Task[None]], played: Played) -> None:
    """A person still acting when the work phase ended is stopped (and it is said)."""
    for task in people:
        if not task.done():
            task.cancel()
            played.notes.append("a person was still acting when the work phase ended: stopped")
    for task in people:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _restart_dead_workers(fleet: Fleet, played: Played) -> None:
    for host in fleet.worker_hosts:
        worker = fleet.workers.get(host.name)
        if worker is None or not worker.running:
            played.notes.append(f"worker on {host.name} was not running at the end: restarted")
            await fleet.start_worker(host)
            await fleet.worker_ready(host)


async def _quiet(fleet: Fleet, played: Played) -> bool:
    """Every run of the schedule's workflows is over: its processes gone, or (for a run
    no process of which was ever seen) ended in Prefect. A run marked superseded may
    well be alive: its process is what counts."""
    return not await _still_running(fleet, played)


async def _still_running(fleet: Fleet, played: Played) -> list[str]:
    witness = fleet.witness
    assert witness is not None
    ids = {w.workflow_id for w in played.schedule.workflows}
    async with get_client() as client:
        runs = await deployment_runs(client, "durable-chat", played.started - timedelta(minutes=1))
    now, running = time.time(), []
    for run in runs:
        if run.parameters.get("workflow_id") not in ids:
            continue
        seen = witness.runs.get(str(run.id))
        if (seen is not None and now - seen.last < ALIVE) or (seen is None and not ended(run)):
            running.append(str(run.id))
    return running


async def _settled(played: Played) -> bool:
    """Every run of the schedule's workflows ended in Prefect too: a run whose process
    died is marked by the sweep (Crashed, once ``relaunch_start`` has passed)."""
    ids = {w.workflow_id for w in played.schedule.workflows}
    async with get_client() as client:
        runs = await deployment_runs(client, "durable-chat", played.started - timedelta(minutes=1))
    return all(ended(r) for r in runs if r.parameters.get("workflow_id") in ids)


async def _silence(fleet: Fleet, played: Played) -> None:
    """Kill what is left of the schedule's runs after the quiet limit, so the next
    schedule starts on a quiet fleet (and say so)."""
    witness = fleet.witness
    assert witness is not None
    for run_id in await _still_running(fleet, played):
        seen = witness.runs.get(run_id)
        for pid in seen.pids if seen else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        played.silenced.append(run_id)
        played.notes.append(f"run {run_id} was still going after the quiet limit: killed")


async def _free_stuck_sweeps(fleet: Fleet, played: Played) -> None:
    """A sweep run left unfinished with no process alive (its host was killed) holds the
    sweep's only slot: the schedule's checks report it; then the lab marks it crashed,
    as Prefect's own zombie detection eventually would, so the next schedule starts
    with a sweep that runs."""
    witness = fleet.witness
    assert witness is not None
    now = time.time()
    async with get_client() as client:
        sweeps = await deployment_runs(
            client, "orphan-sweep", played.started - timedelta(minutes=10)
        )
        for sweep in sweeps:
            if sweep.state_type not in (StateType.PENDING, StateType.RUNNING):
                continue
            seen = witness.runs.get(str(sweep.id))
            if seen is not None and now - seen.last < STUCK:
                continue
            if seen is None and (sweep.created is None or now - sweep.created.timestamp() < STUCK):
                continue
            message = "fleet lab: no process of this run is alive (its host was killed)"
            await client.set_flow_run_state(sweep.id, Crashed(message=message), force=True)
            played.notes.append(
                f"sweep run {sweep.name} was left {sweep.state_name} with no process: marked crashed"
            )


async def _swept(fleet: Fleet, played: Played) -> bool:
    """No chat of the schedule is unarchived, or a sweep ran once every one of them
    was old enough to be an orphan."""
    coder = fleet.coder
    assert coder is not None
    truth = await read_truth(coder.url, coder.token)
    ids = {w.workflow_id for w in played.schedule.workflows}
    live = [c for i in ids for c in truth.workflow_chats(i) if not c.archived]
    if not live:
        return True
    oldest_due = max(c.created_at for c in live) + timedelta(seconds=fleet.timings.sweep.orphan_age)
    due = max(oldest_due, played.all_ended or played.started)
    async with get_client() as client:
        sweeps = await deployment_runs(client, "orphan-sweep", due)
    return any(ended(s) and s.start_time is not None and s.start_time >= due for s in sweeps)
