"""Memory of processes, read from ``/proc`` (Linux): this process's resident set, and the
resident set (and proportional set) of a process's descendants, sampled in a thread."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1024 * 1024


def rss(pid: int | str = "self") -> int:
    """Resident bytes of one process (0 if it is gone)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    return 0


def pss(pid: int) -> int:
    """Proportional set size in bytes: shared pages split among their sharers (0 if gone)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def parents() -> dict[int, int]:
    """pid -> parent pid of every process."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            found[int(stat.parent.name)] = int(text[text.rindex(")") + 2 :].split()[1])
    return found


def descendants(root: int) -> set[int]:
    table = parents()
    children: dict[int, list[int]] = {}
    for pid, ppid in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


@dataclass
class Peak:
    """The largest value each sampled figure reached."""

    rss: int = 0
    pss: int = 0
    processes: int = 0
    samples: int = 0


@contextmanager
def sampling(read: Callable[[Peak], None], interval: float = 0.5) -> Iterator[Peak]:
    """Call ``read(peak)`` every ``interval`` seconds in a thread until the block ends."""
    peak = Peak()
    stop = threading.Event()

    def loop() -> None:
        while True:
            read(peak)
            peak.samples += 1
            if stop.wait(interval):
                return

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()
        read(peak)


def own_rss(peak: Peak) -> None:
    peak.rss = max(peak.rss, rss())


def tree_of(root: int) -> Callable[[Peak], None]:
    """A sampler of ``root``'s descendants (not ``root`` itself): summed RSS and PSS."""

    def read(peak: Peak) -> None:
        pids = descendants(root)
        peak.rss = max(peak.rss, sum(rss(p) for p in pids))
        peak.pss = max(peak.pss, sum(pss(p) for p in pids))
        peak.processes = max(peak.processes, len(pids))

    return read


TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user and system) of each of this process's threads, by native id."""
    found = {}
    for stat in Path("/proc/self/task").glob("*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            fields = text[text.rindex(")") + 2 :].split()
            found[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / TICKS
    return found


@dataclass
class ThreadCpu:
    """Each thread's CPU seconds over a window, by its Python name, threads that ended
    during the window included as they were last seen (sampled every ``interval``)."""

    start: dict[int, float] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)

    def sample(self) -> None:
        for thread in threading.enumerate():
            if thread.native_id is not None:
                self.names.setdefault(thread.native_id, thread.name)
        self.last.update(thread_cpu())

    def by_name(self) -> dict[str, float]:
        """CPU seconds by thread name (numbers in names dropped, so that a pool's threads
        and a worker restarted under a new number add up)."""
        totals: dict[str, float] = {}
        for tid, seconds in self.last.items():
            name = self.names.get(tid, "(not a Python thread)")
            name = "".join(c for c in name if not c.isdigit()).rstrip("-_ ")
            totals[name] = totals.get(name, 0.0) + seconds - self.start.get(tid, 0.0)
        return totals


@contextmanager
def thread_sampling(interval: float = 0.2) -> Iterator[ThreadCpu]:
    """Each thread's CPU over the block (see :class:`ThreadCpu`)."""
    cpu = ThreadCpu(start=thread_cpu())
    with sampling(lambda _peak: cpu.sample(), interval):
        yield cpu


def process_cpu(pid: int) -> float:
    """CPU seconds (user and system, every thread) of one process; 0 if it is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text[text.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    return 0.0


def helpers_cpu() -> float:
    """CPU seconds of every process this one started (and theirs): Prefect's test server
    and the simulator, in the benchmarks."""
    return sum(process_cpu(pid) for pid in descendants(os.getpid()))


def settle(quiet: float = 0.05, window: float = 1.0, limit: float = 180.0) -> float:
    """Wait until the processes this one started use less than ``quiet`` of a core over
    ``window`` seconds, at most ``limit`` seconds; return how long they were still busy
    (the quiet window that ended the wait not counted: 0 when they were quiet already).

    Why: Prefect's server records a run's task runs and logs after the client has sent
    them; a row that starts while it still works on the last row's shares the machine
    with it and pays for what it did not do.
    """
    started = time.perf_counter()
    before = helpers_cpu()
    while time.perf_counter() - started < limit:
        time.sleep(window)
        now = helpers_cpu()
        if now - before < quiet * window:
            break
        before = now
    return max(0.0, time.perf_counter() - started - window)


def apart_from_helpers() -> str:
    """Run this process on the first CPU and the processes it started (Prefect's server,
    the simulator) on the others, so that the server's work on a row, which takes twice
    the row's own CPU, does not take turns with the row being measured. Returns what was
    done, in words; nothing is done on a machine with one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return "one CPU: nothing pinned"
    own, rest = {cpus[0]}, set(cpus[1:])
    _pin(os.getpid(), own)
    for pid in descendants(os.getpid()):
        _pin(pid, rest)
    return f"this process on CPU {cpus[0]}, its helpers on {sorted(rest)}"


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (an affinity is a thread's, and new threads inherit it)."""
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cpus)
