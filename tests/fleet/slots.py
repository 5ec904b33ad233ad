"""Which lab instance is ours: a numbered slot, its names and subnet, and its cleanup.

Other people run labs on this machine at the same time, so a lab never touches
names it does not own. A lab claims a slot ``N`` by creating ``/run/pcfleet/slot-N``
(``mkdir`` is atomic) holding its owner's pid and start time; everything it makes
is named ``pcfleet-N-…`` (namespaces, veth ends, the bridge) and lives in the
subnet ``10.231.N.0/24``. A slot whose owner is gone (a crash, a Ctrl-C that
skipped ``finally``, a SIGKILL) is stale: the next lab to start tears it down
(every process in its namespaces, the namespaces, the links, its folder) before
claiming a slot of its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

STATE = Path("/run/pcfleet")
PREFIX = "pcfleet-"
SLOTS = range(10)
#: A lab folder holding this file is left in place by the cleanup of its stale slot.
KEEP_MARKER = "KEEP"
#: A slot folder without its owner file is being claimed for this long at most.
CLAIMING_SECONDS = 30.0


@dataclass(frozen=True)
class Slot:
    number: int

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.number}-"

    @property
    def folder(self) -> Path:
        return STATE / f"slot-{self.number}"

    def name(self, host: str) -> str:
        """The namespace (and root-side veth) of ``host``: at most 15 characters."""
        name = f"{self.prefix}{host}"
        assert len(name) <= 15, f"interface name too long: {name}"
        return name

    @property
    def bridge(self) -> str:
        return self.name("br")

    def address(self, last: int) -> str:
        return f"10.231.{self.number}.{last}"


def claim(root: Path) -> Slot:
    """Tear down stale slots, then claim a free one for a lab living in ``root``."""
    STATE.mkdir(parents=True, exist_ok=True)
    sweep_stale()
    for number in SLOTS:
        slot = Slot(number)
        try:
            slot.folder.mkdir()
        except FileExistsError:
            continue
        (slot.folder / "owner").write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
        (slot.folder / "root").write_text(str(root))
        return slot
    raise RuntimeError(f"every fleet lab slot under {STATE} is taken by a live lab")


def release(slot: Slot, *, keep_root: bool) -> None:
    """Undo everything of ``slot`` (its folder too, unless ``keep_root``) and free it."""
    if keep_root:
        _root_of(slot).joinpath(KEEP_MARKER).touch()
    teardown(slot)


def sweep_stale() -> list[int]:
    """Tear down every slot whose owner is gone, and names of no slot at all."""
    swept = []
    for number in SLOTS:
        slot = Slot(number)
        owned = slot.folder.exists()
        if (owned and not _owner_alive(slot)) or (not owned and _leftovers(slot)):
            teardown(slot)
            swept.append(number)
    return swept


def teardown(slot: Slot) -> None:
    for ns in _namespaces(slot):
        kill_namespace(ns)
        _ip("netns", "del", ns)
    for link in _links(slot):
        _ip("link", "del", link)
    root = _root_of(slot)
    if root != Path() and root.exists() and not (root / KEEP_MARKER).exists():
        shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(slot.folder, ignore_errors=True)


def kill_namespace(ns: str) -> list[int]:
    """SIGKILL every process in namespace ``ns`` (frozen first, so none forks meanwhile).

    Each is held by a pidfd, then checked to be in ``ns``, before it is signalled: a process
    listed that exits before it is signalled may give its number to a new process elsewhere
    (this machine's pid_max is 32768, and a test run spawns that many), which must not be
    killed in its place (a changed-prompt run on w3 was, in a CI run of the fleet scenario).
    """
    killed: list[int] = []
    try:
        home = os.stat(f"/run/netns/{ns}").st_ino
    except FileNotFoundError:
        return killed  # no such namespace: nothing runs in it
    for _ in range(50):
        held = [h for pid in namespace_pids(ns) if (h := _hold(pid, home)) is not None]
        if not held:
            return killed
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for _pid, fd in held:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, sig)
        for pid, fd in held:
            os.close(fd)
            killed.append(pid)
        time.sleep(0.05)
    raise RuntimeError(f"processes in {ns} survived SIGKILL: {namespace_pids(ns)}")


def _hold(pid: int, namespace: int) -> tuple[int, int] | None:
    """A pidfd on ``pid`` if it is a process in the network namespace ``namespace`` (its
    inode) once held; None if it is gone or elsewhere."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    try:
        if os.stat(f"/proc/{pid}/ns/net").st_ino == namespace:
            return pid, fd
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    os.close(fd)
    return None


def namespace_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def _namespaces(slot: Slot) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(slot.prefix)]


def _links(slot: Slot) -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False)
    names = [line.split(":")[1].strip().split("@")[0] for line in out.stdout.splitlines()]
    return [n for n in names if n.startswith(slot.prefix)]


def _leftovers(slot: Slot) -> bool:
    return bool(_namespaces(slot) or _links(slot))


def _owner_alive(slot: Slot) -> bool:
    try:
        pid_text, started = (slot.folder / "owner").read_text().split()
    except (OSError, ValueError):
        # Claimed this instant, owner not written yet: alive (unless long abandoned).
        with contextlib.suppress(OSError):
            return time.time() - slot.folder.stat().st_mtime < CLAIMING_SECONDS
        return False
    return _start_time(int(pid_text)) == started


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks (tells a live owner from a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2 :].split()[19]


def _root_of(slot: Slot) -> Path:
    try:
        return Path((slot.folder / "root").read_text().strip())
    except OSError:
        return Path()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, check=False)
