"""Playing one fault: wait for its moment, find its host, do it, wait, undo it, record it.

At most one fault holds a host at a time, and a fault that would leave no worker
host able to work (killed or cut off) is skipped, with a note: the invariants
speak of workflows finishing on whichever host survives, so one must.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field

from coder_chat.errors import CoderError

from .fleet import Fleet, to_the_end
from .journal import InFlight, in_flight
from .net import Host
from .observe import Observer
from .plan import HOST_FAULTS, Fault, Moment

#: The longest an end moment waits for its event (an epoch that never comes, say), unless
#: the lab's limits say otherwise.
END_FALLBACK = 90.0
#: Faults that leave a host unable to work at all.
DISABLING = frozenset({"kill-host", "cut-host"})


@dataclass
class FaultRecord:
    fault: Fault
    host: str = ""
    started: float | None = None
    ended: float | None = None
    #: Flow runs whose processes were alive on the host when the fault began.
    runs: list[str] = field(default_factory=list)
    #: The run holding the workflow the fault was aimed at (``running:<workflow>``), then.
    aimed: str = ""
    #: Sends the journal showed in flight on the host's workflows when the fault began.
    in_flight: list[InFlight] = field(default_factory=list)
    note: str = ""

    def describe(self) -> str:
        when = f" {self.started:.1f}..{self.ended:.1f}" if self.started and self.ended else ""
        host = f" on {self.host}" if self.host else ""
        note = f" [{self.note}]" if self.note else ""
        return f"{self.fault.describe()}{host}{when}{note}"


@dataclass
class Injector:
    fleet: Fleet
    observer: Observer
    started: float
    #: How long an end moment waits for its event (see END_FALLBACK).
    end_fallback: float = END_FALLBACK
    busy: set[str] = field(default_factory=set)
    disabled: set[str] = field(default_factory=set)
    #: One per fault played, in the order they were scheduled (also those never reached).
    records: list[FaultRecord] = field(default_factory=list)

    async def play(self, fault: Fault) -> FaultRecord:
        record = FaultRecord(fault, note="its moment never came")
        self.records.append(record)
        await self._reach(fault.start, self.started, limit=None)
        record.note = ""
        host = self._target(fault, record)
        if host is None and fault.kind in HOST_FAULTS:
            return record
        end = self._end(fault)
        await self._begin(fault, host, record)
        try:
            await self._do(fault, host, record)
            if end is not None:
                await self._reach(end, time.monotonic(), self.end_fallback)
        finally:
            # Also when cancelled mid-fault (the schedule ended, or Ctrl-C): heal first, to
            # the end even when the cancellation comes while healing (a worker restarting
            # takes seconds; ci seed 16 was cancelled there and kept no end).
            await to_the_end(self._heal(fault, host, record))
        return record

    async def _heal(self, fault: Fault, host: Host | None, record: FaultRecord) -> None:
        if host is not None:
            await self._undo(fault, host, record)
            self.busy.discard(host.name)
            self.disabled.discard(host.name)
        record.ended = time.time()

    def _end(self, fault: Fault) -> Moment | None:
        """The fault's end, with an "epoch 0" made the epoch after the one held now."""
        end = fault.end
        if end is None or end.kind != "epoch" or end.number:
            return end
        number = self.observer.epoch(end.workflow_id) + 1
        return Moment(end.kind, end.delay, end.workflow_id, number)

    async def _begin(self, fault: Fault, host: Host | None, record: FaultRecord) -> None:
        """What the record must say of the moment the fault strikes."""
        record.started = time.time()
        if fault.target.startswith("running:"):
            record.aimed = self.observer.holder(fault.target.removeprefix("running:")) or ""
        if host is not None:
            record.host, record.runs = host.name, self._runs_on(host)
            record.in_flight = await self._in_flight(host)

    async def _reach(self, moment: Moment, since: float, limit: float | None) -> None:
        await reach(self.observer, moment, since, limit)

    def _target(self, fault: Fault, record: FaultRecord) -> Host | None:
        if not fault.target:
            return None
        name = fault.target
        if name.startswith("running:"):
            name = self.observer.host_of(name.removeprefix("running:")) or ""
        host = self.fleet.hosts.get(name)
        if host is None:
            record.note = f"skipped: no host runs {fault.target.removeprefix('running:')}"
        elif host.name in self.busy:
            record.note = f"skipped: {host.name} already has a fault"
        elif fault.kind in DISABLING and len(self.disabled | {host.name}) >= len(
            self.fleet.worker_hosts
        ):
            record.note = "skipped: it would leave no worker host able to work"
        else:
            self.busy.add(host.name)
            if fault.kind in DISABLING:
                self.disabled.add(host.name)
            return host
        return None

    def _runs_on(self, host: Host) -> list[str]:
        assert self.fleet.witness is not None
        now = time.time()
        return [
            r
            for r, seen in self.fleet.witness.runs.items()
            if seen.host == host.name and now - seen.last < 2
        ]

    async def _in_flight(self, host: Host) -> list[InFlight]:
        found: list[InFlight] = []
        for workflow_id in self.observer.workflow_ids:
            if self.observer.host_of(workflow_id) == host.name:
                with contextlib.suppress(CoderError, OSError):
                    found += await in_flight(self.fleet, self.observer.store, workflow_id)
        return found

    async def _do(self, fault: Fault, host: Host | None, record: FaultRecord) -> None:
        fleet, net = self.fleet, self.fleet.net
        if fault.kind == "restart-store":
            await fleet.store_pg.arestart()
        elif fault.kind == "restart-prefect":
            record.note = f"the API was gone for {await fleet.restart_server():.1f}s"
        elif host is None:
            return
        elif fault.kind == "kill-host":
            record.note = f"{len(await fleet.kill_host(host))} processes killed"
        elif fault.kind == "cut-host":
            await net.link(host, up=False)
        elif fault.kind in ("cut-store", "cut-coder"):
            await net.cut(host, self._peer(fault), fault.how)
        elif fault.kind == "shape-coder":
            assert fault.shape is not None
            await net.shape(
                host, self._peer(fault), fault.shape.rate_kbit, fault.shape.queue_packets
            )
            self._impair({host.address: fault.shape.delay})

    async def _undo(self, fault: Fault, host: Host, record: FaultRecord) -> None:
        fleet, net = self.fleet, self.fleet.net
        if fault.kind == "kill-host":
            await fleet.start_worker(host)
            await fleet.worker_ready(host)
        elif fault.kind == "cut-host":
            await net.link(host, up=True)
        elif fault.kind in ("cut-store", "cut-coder"):
            await net.heal(host, self._peer(fault))
        elif fault.kind == "shape-coder":
            dropped = await net.shaped_drops(host, self._peer(fault))
            await net.unshape(host, self._peer(fault))
            self._impair({})
            record.note = f"{dropped} packets dropped"

    def _peer(self, fault: Fault) -> Host:
        return self.fleet.hosts["store" if fault.kind == "cut-store" else "coder"]

    def _impair(self, delays: dict[str, float]) -> None:
        coder = self.fleet.coder
        assert coder is not None
        coder.impair_file.write_text(json.dumps(delays))


async def reach(observer: Observer, moment: Moment, since: float, limit: float | None) -> None:
    """Wait for ``moment`` (a time after ``since``, or a workflow's event, for at most
    ``limit`` seconds)."""
    if moment.kind == "time":
        await asyncio.sleep(max(0.0, since + moment.delay - time.monotonic()))
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(limit):
            await observer.until(moment.kind, moment.workflow_id, moment.number)
    await asyncio.sleep(moment.delay)
