"""The lab's side of the fork server (tests/lab/forkserver.py): one server a test process,
started at its first child, and each child it forked as a :class:`Forked` process.

The server runs the first child's environment; every child gets its own anyway. It ends when
this process does (the end of its input).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .child import GO, NOT_NEEDED
from .forkserver import Request

ROOT = Path(__file__).resolve().parents[2]


class Forked:
    """A forked child as the lab sees it: what asyncio's ``Process`` gave it (``pid``,
    ``returncode``, ``wait``), and the signals that let it go or end it unneeded."""

    def __init__(self, pid: int, exit_file: Path, server: subprocess.Popen[str]) -> None:
        self.pid = pid
        self._exit = exit_file
        self._server = server

    @property
    def returncode(self) -> int | None:
        """Its exit code once it ended (negative: the signal that ended it), else None."""
        try:
            return int(self._exit.read_text())
        except FileNotFoundError:
            return None

    async def wait(self) -> int:
        while (code := self.returncode) is None:
            # Once the server has ended, no one reaps the child: read its file a last time.
            if self._server.poll() is not None and self.returncode is None:
                raise RuntimeError(f"the fork server ended before child {self.pid}")
            await asyncio.sleep(0.01)
        return code

    def go(self) -> None:
        self._signal(GO)

    def not_needed(self) -> None:
        self._signal(NOT_NEEDED)

    def _signal(self, number: int) -> None:
        # An ended child's pid is reaped and may be another process's by now: signal the
        # living only (GO and NOT_NEEDED would kill a process not waiting for them).
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)


_server: subprocess.Popen[str] | None = None
#: One request and its answer at a time (labs of a campaign fork from their own threads).
_asking = threading.Lock()


def fork(params: Mapping[str, Any], env: Mapping[str, str], stdout: Path, stderr: Path) -> Forked:
    """A new child for ``params`` with environment ``env``, its output in these files
    (blocking: call it from a thread)."""
    with _asking:
        return _fork(params, env, stdout, stderr)


def _fork(params: Mapping[str, Any], env: Mapping[str, str], stdout: Path, stderr: Path) -> Forked:
    server = _running_server(env)
    for output in (stdout, stderr):
        output.write_bytes(b"")  # there from the start: the lab reads them before the child runs
    exit_file = stdout.with_suffix(".exit")
    request: Request = {
        "params": dict(params),
        "env": dict(env),
        "stdout": str(stdout),
        "stderr": str(stderr),
        "exit": str(exit_file),
    }
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(json.dumps(request) + "\n")
    server.stdin.flush()
    answer = server.stdout.readline()
    if not answer:
        raise RuntimeError(f"the fork server ended (exit {server.wait()})")
    return Forked(int(answer), exit_file, server)


def _running_server(env: Mapping[str, str]) -> subprocess.Popen[str]:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen(
            [sys.executable, "-m", "tests.lab.forkserver"],
            cwd=ROOT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        atexit.register(_stop, _server)
    return _server


def _stop(server: subprocess.Popen[str]) -> None:
    if server.stdin is not None:
        server.stdin.close()
    server.wait()
