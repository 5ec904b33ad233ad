"""The crash lab's fork server: ``python -m tests.lab.forkserver`` imports Python, Prefect and
the flows once, then forks every crash-lab child of its test process from that state.

A child started as ``python -m`` spent two CPU-seconds importing before it ran a step, and a
suite run starts some 150 of them. A forked child is still a process of its own, in a session
of its own, that the lab kills with SIGKILL; it only skips the imports. Before it runs, it takes
the environment its lab gives it and has Prefect read its settings again, so it sees what a
freshly started child would (its Prefect API, home and result storage, the simulator's
``CODER_*``).

The protocol, one line each way: the lab writes a request as JSON (see :class:`Request`), the
server answers the child's pid once the child leads a session of its own. When a child ends,
the server reaps it and writes its exit code (negative: the signal that ended it, as asyncio
says it) to the request's ``exit`` file. At the end of its input the server exits; children
still running live on, for their labs to kill.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any, TypedDict

from . import child

#: What children run, imported before the first fork (a flow's module and what running any
#: flow imports on its first call). A child whose flow is elsewhere imports its module itself.
PRELOADED = (
    "prefect.flow_engine",
    "prefect.task_engine",
    "prefect.blocks.core",
    "pydantic_core",
    "prefect_coder.flows.durable_chat",
    "prefect_coder.examples.refund",
    "prefect_coder.settings",
)


class Request(TypedDict):
    params: dict[str, Any]  # the flow's parameters (see tests/lab/child.py)
    env: dict[str, str]  # the child's whole environment
    stdout: str  # files its output goes to (made by the lab, so there before the child runs)
    stderr: str
    exit: str  # where the server writes its exit code once it ended


_exits: dict[int, str] = {}


def _reap(signum: int, frame: FrameType | None) -> None:
    """SIGCHLD: write each ended child's exit code where its lab waits for it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = _exits.pop(pid, None)
        if path is not None:
            # A lab gone with its folder waits for nothing: the server serves the next.
            with contextlib.suppress(OSError):
                written = Path(f"{path}.part")
                written.write_text(str(os.waitstatus_to_exitcode(status)))
                written.rename(path)  # whole or absent, for a lab polling it


def _fork(request: Request) -> int:
    """Fork; the child's pid in the server, 0 in the child. The server answers once the child
    has its own session (a kill of its process group before that would miss it), and records
    where its exit goes before a SIGCHLD can ask."""
    led, leading = os.pipe()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    pid = os.fork()
    if pid == 0:
        os.close(led)
        os.setsid()
        os.close(leading)
        return 0
    os.close(leading)
    os.read(led, 1)  # end of file: the child leads its session, or died trying
    os.close(led)
    _exits[pid] = request["exit"]
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    return pid


def serve() -> Request | None:
    """Answer requests until the input ends (None); in a forked child, its request."""
    for line in sys.stdin:
        request: Request = json.loads(line)
        pid = _fork(request)
        if pid == 0:
            return request
        print(pid, flush=True)
    return None


def become(request: Request) -> None:
    """Turn the forked server into the child its request describes."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    stdin = os.open(os.devnull, os.O_RDONLY)
    stdout = os.open(request["stdout"], os.O_WRONLY | os.O_APPEND)  # the lab made them
    stderr = os.open(request["stderr"], os.O_WRONLY | os.O_APPEND)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    # Prefect read its settings and set up its logging when the server imported it.
    import prefect.context
    import prefect.logging.configuration

    prefect.context.refresh_global_settings_context()
    prefect.logging.configuration.setup_logging()


def main() -> int:
    # Blocked here, so in every child from its first instant: a "go" sent before the child
    # waits for it stays pending instead of killing it.
    signal.pthread_sigmask(signal.SIG_BLOCK, set(child.SIGNALS))
    for module in PRELOADED:
        importlib.import_module(module)
    # A thread would not survive a fork (and could hold a lock the child then waits on).
    assert threading.active_count() == 1, threading.enumerate()
    signal.signal(signal.SIGCHLD, _reap)
    gc.freeze()  # the imported objects stay shared with every child, not copied on a collection
    request = serve()
    if request is None:
        return 0
    become(request)
    return child.main(request["params"])


if __name__ == "__main__":
    sys.exit(main())
