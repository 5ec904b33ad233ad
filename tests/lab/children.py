"""The crash lab: real child processes running a flow (``durable_chat`` unless told), killed with SIGKILL.

Every child is a process the fork server made (tests/lab/forkserver.py), in its own
session (so its process group holds everything it started), running
tests/lab/child.py against the test's simulator and
payments fake, the session's one Prefect test API, one ``PREFECT_HOME`` (the step
result cache) and one SQLite store shared by all children of a test. A crash is
``os.killpg(pgid, SIGKILL)``: no ``finally``, no shutdown hook runs. Whatever is
still running when a test ends is killed the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coder_chat.simulator import Simulator
from prefect_coder.payments import Ledger

from . import forked
from .child import READY, RESULT_PREFIX
from .forked import Forked

CHARGE_CARD = "prefect_coder.demo_tools:charge_card"
#: How long a child may take to reach a crash point (the fork server's first start included).
REACH_TIMEOUT = 90.0
#: How long a recovering child may take to finish its whole workflow.
FINISH_TIMEOUT = 120.0


class ChildFailed(AssertionError):
    pass


@dataclass
class Child:
    """One child process and where its output went."""

    name: str
    proc: Forked
    stdout: Path
    stderr: Path
    #: The child's parameters as canonical JSON.
    params: str = ""
    started: bool = False
    killed: bool = False
    #: Its environment overrides as canonical JSON (a child on "another machine").
    overrides: str = "{}"

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    def output(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    @property
    def ready(self) -> bool:
        """Whether it has imported everything and waits for :meth:`CrashLab.go`."""
        return READY in self.stdout.read_text(errors="replace").splitlines()

    def returned(self) -> Returned | None:
        """What the child's flow returned, as it printed it, or ``None`` if it printed nothing."""
        for line in self.stdout.read_text(errors="replace").splitlines():
            if line.startswith(RESULT_PREFIX):
                return Returned(json.loads(line[len(RESULT_PREFIX) :]))
        return None

    def results(self) -> list[dict[str, Any]] | None:
        """The step results a ``durable_chat`` child printed, or ``None`` if it printed none."""
        returned = self.returned()
        if returned is None:
            return None
        results: list[dict[str, Any]] = returned.value
        return results


@dataclass(frozen=True)
class Returned:
    """A flow's return value as JSON (``None`` is a value a flow may return)."""

    value: Any


@dataclass
class CrashLab:
    sim: Simulator
    payments_url: str
    payments: Ledger
    root: Path
    api_url: str
    children: list[Child] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.root / "prefect-home"

    @property
    def db(self) -> Path:
        return self.root / "ledger.sqlite3"

    @property
    def tenant(self) -> str:
        return str(self.sim.organization_id)

    def machine(self, name: str) -> dict[str, str]:
        """The environment of another worker machine: its own Prefect home and result
        storage (same Prefect API, same store, same Coder)."""
        home = self.root / f"{name}-prefect-home"
        return {"PREFECT_HOME": str(home), "PREFECT_LOCAL_STORAGE_PATH": str(home / "storage")}

    def env(self, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
        """The children's environment; ``overrides`` replace any of it (e.g. another
        ``PREFECT_HOME`` for a child playing a second machine)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "CODER_"))}
        env.update(self.sim.env())
        env.update(
            {
                "PREFECT_API_URL": self.api_url,
                "PREFECT_HOME": str(self.home),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_CODER_SQLITE_PATH": str(self.db),
                "PAYMENTS_URL": self.payments_url,
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(overrides or {})
        return env

    # -- children -------------------------------------------------------------------------
    async def spawn(self, env: Mapping[str, str] | None = None, **params: Any) -> Child:
        """Start a child for ``durable_chat(**params)`` (or the flow ``params["flow"]``
        names, as ``module:function``); it imports, then waits for :meth:`go`.

        ``env`` overrides part of the children's environment for this child only.
        """
        name = f"child-{len(self.children) + 1}"
        out, err = self.root / f"{name}.out", self.root / f"{name}.err"
        proc = await asyncio.to_thread(forked.fork, params, self.env(env), out, err)
        child = Child(
            name,
            proc,
            out,
            err,
            json.dumps(params, sort_keys=True),
            overrides=json.dumps(dict(env or {}), sort_keys=True),
        )
        self.children.append(child)
        return child

    async def ready(self, child: Child, timeout: float = REACH_TIMEOUT) -> Child:
        """Wait until a spawned child has imported everything (so timing starts at :meth:`go`)."""
        await self.until(lambda: child.ready, child, f"{child.name} ready", timeout)
        return child

    def go(self, child: Child) -> Child:
        """Let a spawned child run its workflow."""
        child.proc.go()
        child.started = True
        return child

    async def start(
        self, *, reruns: int = 0, env: Mapping[str, str] | None = None, **params: Any
    ) -> Child:
        """A fresh process running ``durable_chat(**params)`` (or ``params["flow"]``) from now on.

        ``reruns`` spawns that many more children with the same parameters, which
        wait, ready, while this one runs; a later ``start`` with the same
        parameters (and ``env``) takes one of them (still a process that has done
        nothing yet). ``durable_chat`` gets short time limits unless told otherwise.
        """
        if "flow" not in params:
            params.setdefault("request_timeout_seconds", 10.0)
            params.setdefault("step_deadline_seconds", 60.0)
        key = json.dumps(params, sort_keys=True)
        overrides = json.dumps(dict(env or {}), sort_keys=True)
        spare = next(
            (
                c
                for c in self.children
                if c.params == key and c.overrides == overrides and not c.started and c.running
            ),
            None,
        )
        child = self.go(spare or await self.spawn(env, **params))
        for _ in range(reruns):
            await self.spawn(env, **params)
        return child

    async def crash(self, child: Child) -> None:
        """SIGKILL the child's whole process group and reap it."""
        if not child.running:
            raise ChildFailed(f"{child.name} exited before the crash point:\n{child.tail()}")
        self._kill(child)
        await child.proc.wait()

    async def finish(self, child: Child, timeout: float = FINISH_TIMEOUT) -> list[dict[str, Any]]:
        """Wait for a ``durable_chat`` child to end cleanly and return its step results."""
        results: list[dict[str, Any]] = (await self.finish_flow(child, timeout)).value
        return results

    async def finish_flow(self, child: Child, timeout: float = FINISH_TIMEOUT) -> Returned:
        """Wait for the child to end cleanly and return what its flow returned."""
        try:
            async with asyncio.timeout(timeout):
                code = await child.proc.wait()
        except TimeoutError:
            self._kill(child)
            await child.proc.wait()
            raise ChildFailed(
                f"{child.name} did not finish in {timeout}s:\n{child.tail()}"
            ) from None
        if code != 0:
            raise ChildFailed(f"{child.name} exited with {code}:\n{child.tail()}")
        returned = child.returned()
        if returned is None:
            raise ChildFailed(f"{child.name} printed no results:\n{child.tail()}")
        return returned

    async def until(
        self,
        predicate: Callable[[], bool],
        child: Child | None,
        what: str,
        timeout: float = REACH_TIMEOUT,
    ) -> None:
        """Poll the test's own peers until ``predicate`` holds; fail early if ``child`` died."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout
        while not predicate():
            if child is not None and not child.running:
                raise ChildFailed(f"{child.name} exited while waiting for {what}:\n{child.tail()}")
            if loop.time() > give_up:
                tail = child.tail() if child is not None else ""
                raise ChildFailed(f"timed out waiting for {what}:\n{tail}")
            await asyncio.sleep(0.01)

    async def held(self, waiter: Any, child: Child, what: str) -> Any:
        """Await a ``wait_held`` coroutine, failing early if the child died first."""
        task = asyncio.ensure_future(waiter)
        try:
            await self.until(task.done, child, what)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return task.result()

    async def close(self) -> None:
        for child in self.children:
            if not child.started:
                child.proc.not_needed()  # a spawned child never let go exits on its own
            if child.running:
                self._kill(child)
                with contextlib.suppress(ProcessLookupError):
                    await child.proc.wait()

    def outputs(self) -> bytes:
        return b"".join(c.stdout.read_bytes() + c.stderr.read_bytes() for c in self.children)

    @staticmethod
    def _kill(child: Child) -> None:
        child.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.proc.pid, signal.SIGKILL)
