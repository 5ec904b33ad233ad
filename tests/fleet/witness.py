"""Which flow run owned a socket: attribution of requests the peers logged by address.

The Coder front door and the store's statement log know the address and port a
request came from; a worker host runs several flow runs (and, after a partition
heals, the run that was cut off beside its successor), so the host alone does
not say who acted. The witness looks, a few times a second, at every process in
the worker hosts' namespaces: a process whose environment holds
``PREFECT__FLOW_RUN_ID`` belongs to that flow run, and so does every TCP socket
it holds (``/proc/PID/fd`` → socket inode → the namespace's ``/proc/PID/net/tcp``).
A connection is pooled and long-lived, so a glimpse of it suffices; one opened
and closed between two looks stays unattributed, and is reported as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .net import Host

INTERVAL = 0.2
#: How far from a sighting a request on the same socket is still taken to be the same.
SLACK = 30.0


@dataclass
class Sighting:
    flow_run_id: str
    host: str
    first: float
    last: float


@dataclass
class RunSeen:
    """Where and when a flow run's processes were seen alive."""

    host: str
    first: float
    last: float
    pids: set[int] = field(default_factory=set)


@dataclass
class Witness:
    hosts: list[Host]
    sockets: dict[tuple[str, int], list[Sighting]] = field(default_factory=dict)
    runs: dict[str, RunSeen] = field(default_factory=dict)
    #: (pid, start time) -> the flow run id its environment names.
    _owners: dict[tuple[int, str], str] = field(default_factory=dict)

    def who(self, src: str, at: float) -> Sighting | None:
        """The flow run whose socket ``src`` ("ip:port") was, around ``at``."""
        address, _, port = src.rpartition(":")
        found = [
            s
            for s in self.sockets.get((address, int(port)), [])
            if s.first - SLACK <= at <= s.last + SLACK
        ]
        return min(found, key=lambda s: abs(at - (s.first + s.last) / 2), default=None)

    def host_of(self, address: str) -> str | None:
        return next((h.name for h in self.hosts if h.address == address), None)

    async def watch(self) -> None:
        while True:
            await asyncio.to_thread(self.look)
            await asyncio.sleep(INTERVAL)

    def look(self) -> None:
        now = time.time()
        by_inode = {_ns_inode(h): h for h in self.hosts}
        tables: dict[str, dict[int, tuple[str, int]]] = {}
        for pid in _pids():
            host = by_inode.get(_net_inode(pid))
            if host is None:
                continue
            run = self._owner(pid)
            if not run:
                continue
            self._saw_run(run, host, pid, now)
            if host.name not in tables:
                tables[host.name] = _tcp_table(pid)
            for inode in _socket_inodes(pid):
                local = tables[host.name].get(inode)
                if local is not None:
                    self._saw_socket(local, run, host, now)

    def _owner(self, pid: int) -> str:
        """The flow run ``pid`` belongs to, or "". Only a run is remembered: a process
        looked at between its fork and its exec still shows its parent's environment
        (the worker's, which names no run), and keeps its pid and start time through
        the exec; remembering that "" hid a whole flow run from the lab on a loaded
        machine (ci seed 16: a run that took 4 steps was never seen on any host)."""
        key = (pid, _start_time(pid))
        run = self._owners.get(key) or _environ(pid).get("PREFECT__FLOW_RUN_ID", "")
        if run:
            self._owners[key] = run
        return run

    def _saw_run(self, run: str, host: Host, pid: int, now: float) -> None:
        seen = self.runs.setdefault(run, RunSeen(host.name, now, now))
        seen.last = now
        seen.pids.add(pid)

    def _saw_socket(self, local: tuple[str, int], run: str, host: Host, now: float) -> None:
        sightings = self.sockets.setdefault(local, [])
        if sightings and sightings[-1].flow_run_id == run and now - sightings[-1].last < SLACK:
            sightings[-1].last = now
        else:
            sightings.append(Sighting(run, host.name, now, now))


def _ns_inode(host: Host) -> int:
    try:
        return os.stat(f"/run/netns/{host.ns}").st_ino
    except OSError:
        return -1


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _net_inode(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(os.readlink(f"/proc/{pid}/ns/net").split("[")[1].rstrip("]"))
    return -2


def _start_time(pid: int) -> str:
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split()[19]
    return ""


def _environ(pid: int) -> dict[str, str]:
    with contextlib.suppress(OSError):
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
        return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}
    return {}


def _socket_inodes(pid: int) -> list[int]:
    inodes = []
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.append(int(target[8:-1]))
    return inodes


def _tcp_table(pid: int) -> dict[int, tuple[str, int]]:
    """inode -> (local address, local port) of every IPv4 TCP socket in pid's namespace."""
    table = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            address, port = fields[1].split(":")
            octets = bytes.fromhex(address)[::-1]
            table[int(fields[9])] = (".".join(str(b) for b in octets), int(port, 16))
    return table
