"""A fault cancelled while it heals still heals to the end and keeps its end (ci seed 16:
a host kill cancelled as its worker restarted left a record with no end, and a worker
started by nobody's await)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

from .faults import Injector
from .fleet import Fleet, to_the_end
from .net import Host
from .observe import Observer
from .plan import Fault, Moment


@dataclass
class _Witness:
    runs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _SlowFleet:
    """Just what the injector asks of a fleet for a host kill; a worker starts slowly."""

    hosts: dict[str, Host]
    start_seconds: float
    witness: _Witness = field(default_factory=_Witness)
    net: None = None
    healing: asyncio.Event = field(default_factory=asyncio.Event)
    ready: bool = False

    @property
    def worker_hosts(self) -> list[Host]:
        return [*self.hosts.values()]

    async def kill_host(self, host: Host) -> list[int]:
        return [1, 2]

    async def start_worker(self, host: Host) -> None:
        self.healing.set()

    async def worker_ready(self, host: Host) -> None:
        await asyncio.sleep(self.start_seconds)
        self.ready = True


@dataclass
class _Observer:
    workflow_ids: list[str] = field(default_factory=list)


async def test_a_fault_cancelled_while_it_heals_heals_and_keeps_its_end() -> None:
    hosts = {name: Host(name, f"ns-{name}", f"10.0.0.{i}") for i, name in enumerate("ab")}
    fleet = _SlowFleet(hosts, start_seconds=0.3)
    injector = Injector(
        cast(Fleet, fleet), cast(Observer, _Observer()), asyncio.get_running_loop().time()
    )
    fault = Fault("kill-host", Moment("time"), target="a", end=Moment("time", 0.1))
    playing = asyncio.create_task(injector.play(fault))
    await fleet.healing.wait()  # the kill done, its wait over: healing now
    playing.cancel()
    await asyncio.gather(playing, return_exceptions=True)
    [record] = injector.records
    assert fleet.ready, "the worker's start was left to run unawaited"
    assert record.started is not None and record.ended is not None, record.describe()
    assert record.note == "2 processes killed"
    assert not injector.busy and not injector.disabled


async def test_to_the_end_finishes_its_action_then_passes_the_cancellation_on() -> None:
    done: list[str] = []

    async def action() -> str:
        await asyncio.sleep(0.2)
        done.append("action")
        return "done"

    task = asyncio.create_task(to_the_end(action()))
    await asyncio.sleep(0.05)
    task.cancel()
    results = await asyncio.gather(task, return_exceptions=True)
    assert done == ["action"]
    assert isinstance(results[0], asyncio.CancelledError)
