"""Real processes for the integration tests: start one, wait for it, kill all it started.

Every process starts in a session of its own (so its process group is its own),
with stdout and stderr in one log file under the test's temporary directory.
Killing a process SIGKILLs every process group in its tree: Prefect's process
worker starts each flow run in a session of its own, so the worker's group alone
is not the whole worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from tests.ports import free_port as free_port

T = TypeVar("T")

#: For a test that reads process trees (to find and kill a worker's flow runs) in /proc.
NEEDS_PROC = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="reads process trees in /proc"
)


@dataclass
class Proc:
    name: str
    argv: tuple[str, ...]
    proc: asyncio.subprocess.Process
    log: Path

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 80) -> str:
        return "\n".join(self.output().splitlines()[-lines:])


@dataclass
class Processes:
    """Every process a test starts; ``close`` kills whatever is left of them."""

    root: Path
    started: list[Proc] = field(default_factory=list)
    #: Every process group the test has killed, and when (:func:`boot_ticks`).
    killed: dict[int, int] = field(default_factory=dict)

    async def start(
        self, name: str, *argv: str, env: dict[str, str], cwd: Path, stdin: bytes | None = None
    ) -> Proc:
        log = self.root / f"{len(self.started):02d}-{name}.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=env,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            await proc.stdin.drain()
            proc.stdin.close()
        started = Proc(name, tuple(argv), proc, log)
        self.started.append(started)
        return started

    async def run(
        self,
        name: str,
        *argv: str,
        env: dict[str, str],
        cwd: Path,
        timeout: float = 120.0,
        watch: list[Proc] | None = None,
        stdin: bytes | None = None,
    ) -> str:
        """Run a command to its end and return its output; fail with it unless it exits 0.

        Fails early, with their output, if a process in ``watch`` dies meanwhile.
        """
        proc = await self.start(name, *argv, env=env, cwd=cwd, stdin=stdin)

        async def ended() -> int | None:
            return proc.proc.returncode

        try:
            code = await until(ended, f"`{name}` to end", timeout, watch or [], interval=0.2)
        finally:
            if proc.running:
                self.kill(proc)
                await proc.proc.wait()
        output = proc.output()
        assert code == 0, f"`{name}` exited with {code}:\n{output}"
        return output

    def kill(self, proc: Proc) -> None:
        """SIGKILL the process and everything it started: no ``finally``, no shutdown hook runs.

        Prefect's process worker starts each flow run in a session of its own, so the
        worker's process group alone is not the whole worker: every group in the process
        tree is frozen first (so nothing forks or reparents in between), then all are killed.
        """
        if proc.running:  # not reaped yet, so its pid (and group id) is still its own
            for group in freeze_tree(proc.proc.pid) | {proc.proc.pid}:
                self.killed[group] = boot_ticks()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)

    async def crash(self, proc: Proc) -> None:
        """Kill a process that must still be running (it did not exit on its own)."""
        assert proc.running, f"{proc.name} exited on its own:\n{proc.tail()}"
        self.kill(proc)
        await proc.proc.wait()

    def leftovers(self) -> list[str]:
        """Live processes still in any process group the test killed."""
        return survivors(self.killed)

    async def all_dead(self) -> bool:
        return self.leftovers() == []

    async def close(self) -> None:
        for proc in self.started:
            self.kill(proc)
            with contextlib.suppress(ProcessLookupError):
                await proc.proc.wait()

    def diagnostics(self) -> str:
        return "\n".join(
            f"\n===== {p.name} (exit {p.proc.returncode}) =====\n{p.tail()}" for p in self.started
        )


@contextlib.asynccontextmanager
async def managed_processes(root: Path) -> AsyncIterator[Processes]:
    """The processes of one test: printed with their output if it fails, killed at its end."""
    procs = Processes(root)
    try:
        yield procs
    except BaseException:
        print(procs.diagnostics())
        raise
    finally:
        await procs.close()


async def wait_for_line(proc: Proc, pattern: str, timeout: float) -> re.Match[str]:
    """The first line of ``proc``'s output that ``pattern`` matches (``re.search``)."""
    compiled = re.compile(pattern)

    async def found() -> re.Match[str] | None:
        for line in proc.output().splitlines():
            if match := compiled.search(line):
                return match
        return None

    return await until(found, f"{proc.name} to print /{pattern}/", timeout, [proc])


@dataclass(frozen=True)
class Process:
    ppid: int
    group: int
    name: str
    #: When it started, in the clock ticks since boot that ``/proc/<pid>/stat`` counts.
    started: int


def processes() -> dict[int, Process]:
    """pid -> what ``/proc`` says of every live (non-zombie) process."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            # "pid (comm) state ppid pgrp ... starttime ...": comm may hold spaces, so
            # split after ")"; starttime is the 22nd field, the 20th after ")".
            fields = text[text.rindex(")") + 2 :].split()
            if fields[0] != "Z":
                name = text[text.index("(") + 1 : text.rindex(")")]
                found[int(stat.parent.name)] = Process(
                    int(fields[1]), int(fields[2]), name, int(fields[19])
                )
    return found


def boot_ticks() -> int:
    """Now, in the units of :attr:`Process.started`."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def survivors(killed: dict[int, int]) -> list[str]:
    """Live processes of the groups in ``killed`` (group -> :func:`boot_ticks` when it was
    killed) that were there at the kill. Only those: a free pid, and the group id it
    named, is soon handed to a new process (other tests run beside this one)."""
    return [
        f"{pid} {proc.name} (group {proc.group})"
        for pid, proc in processes().items()
        if proc.group in killed and proc.started <= killed[proc.group]
    ]


def freeze_tree(root: int) -> set[int]:
    """SIGSTOP every process group in ``root``'s tree until no new one appears; return them."""
    frozen: set[int] = set()
    ours = os.getpgrp()
    while True:
        table = processes()
        tree, todo = set(), [root]
        while todo:
            pid = todo.pop()
            if pid in table and pid not in tree:
                tree.add(pid)
                todo.extend(p for p, proc in table.items() if proc.ppid == pid)
        groups = {table[pid].group for pid in tree} - frozen - {ours}
        if not groups:
            return frozen
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGSTOP)
        frozen |= groups


def clean_env() -> dict[str, str]:
    """This process's environment without any Prefect, Coder or virtualenv setting of its own."""
    drop = ("PREFECT_", "CODER_", "VIRTUAL_ENV", "PYTEST_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


async def http_ok(url: str) -> bool:
    """Whether ``url`` answers 200."""
    with contextlib.suppress(httpx.HTTPError):
        async with httpx.AsyncClient(timeout=5) as http:
            return (await http.get(url)).status_code == 200
    return False


async def until(
    probe: Callable[[], Awaitable[T | None]],
    what: str,
    timeout: float,
    watch: list[Proc],
    interval: float = 0.2,
) -> T:
    """Poll ``probe`` until it returns something; fail early if a watched process died."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while True:
        value = await probe()
        if value is not None and value is not False:
            return value
        for proc in watch:
            assert proc.running, f"{proc.name} exited while waiting for {what}:\n{proc.tail()}"
        assert loop.time() < give_up, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(interval)
