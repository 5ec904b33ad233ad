"""The fleet itself: its hosts, their services, and what the lab does to a whole host."""

from __future__ import annotations

import asyncio
import re
import secrets
import shlex
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from cryptography.fernet import Fernet

from prefect_coder.payments import Ledger
from tests.integration.procs import Proc, Processes, clean_env, http_ok, until, wait_for_line

from . import slots
from .config import (
    ADDRESSES,
    API_PORT,
    CODER_PORT,
    POOL,
    PREFECT,
    PREFECT_CODER,
    PYTHON,
    ROOT,
    Timings,
)
from .net import Host, Network
from .pg import HostPg
from .witness import Witness

if TYPE_CHECKING:
    from .door import Door

T = TypeVar("T")

STARTUP = 180.0


@dataclass(frozen=True)
class Coder:
    """How the lab's clients reach the simulator (through its front door)."""

    url: str
    token: str
    organization_id: str
    requests_log: Path
    impair_file: Path


@dataclass
class Fleet:
    root: Path
    slot: slots.Slot
    net: Network
    hosts: dict[str, Host]
    procs: Processes
    timings: Timings
    control_pg: HostPg
    store_pg: HostPg
    payments: Ledger
    payments_url: str = ""
    #: The work queue the sweep is deployed to (``default``: any worker runs it).
    sweep_queue: str = "default"
    coder: Coder | None = None
    server: Proc | None = None
    workers: dict[str, Proc] = field(default_factory=dict)
    #: One restart of Prefect's server at a time: two faults may strike together, and
    #: the second must not kill the server the first is starting.
    restarting: asyncio.Lock = field(default_factory=asyncio.Lock)
    witness: Witness | None = None
    #: What Prefect's server asks of every client (its basic authentication): given to
    #: the workers, the CLI and this process, never to anything else.
    auth_string: str = field(default_factory=lambda: f"fleet:{secrets.token_urlsafe(18)}")
    #: The key Prefect's server encrypts blocks' secrets with (else kept in its database).
    block_key: str = field(default_factory=lambda: Fernet.generate_key().decode())
    #: What a client without it got from the API, and one with it (:mod:`.door`).
    door: Door | None = None
    #: Where the lab tells a person what it is doing (the campaign's notes).
    say: Callable[[str], None] = print

    @property
    def api_url(self) -> str:
        return f"http://{self.hosts['ctl'].address}:{API_PORT}/api"

    @property
    def worker_hosts(self) -> list[Host]:
        return [h for name, h in self.hosts.items() if name.startswith("w")]

    def folder(self, host: str) -> Path:
        path = self.root / host
        path.mkdir(parents=True, exist_ok=True)
        return path

    def base_env(self) -> dict[str, str]:
        """What every process that talks to Prefect's API is given."""
        return {
            **clean_env(),
            "PREFECT_API_URL": self.api_url,
            "PREFECT_API_AUTH_STRING": self.auth_string,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
        }

    # -- Prefect's server -----------------------------------------------------------------
    async def start_server(self) -> Proc:
        ctl = self.hosts["ctl"]
        env = {
            **self.base_env(),
            "PREFECT_HOME": str(self.folder("ctl") / "server-home"),
            "PREFECT_SERVER_API_AUTH_STRING": self.auth_string,
            "PREFECT_SERVER_ENCRYPTION_KEY": self.block_key,
            "PREFECT_API_DATABASE_CONNECTION_URL": self.control_pg.dsn.replace(
                "postgresql://", "postgresql+asyncpg://"
            ),
            # The sweep's runs are scheduled every few seconds: look often.
            "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5",
        }
        argv = ctl.exec(PREFECT, "server", "start", "--host", ctl.address)
        argv += ["--port", str(API_PORT), "--no-ui"]
        self.server = await self.procs.start("server", *argv, env=env, cwd=self.folder("ctl"))
        await until(
            lambda: http_ok(f"{self.api_url}/health"),
            "Prefect's server to answer",
            STARTUP,
            [self.server],
            interval=0.5,
        )
        return self.server

    async def restart_server(self) -> float:
        """Kill Prefect's server, restart its database at once, start it again; seconds
        the API was gone. Cancelled mid-way (the schedule ended meanwhile), it finishes
        first: a server killed and never started again leaves the fleet without its API
        (schedule 17/5, a lab error)."""
        return await to_the_end(self._restart_server())

    async def _restart_server(self) -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with self.restarting:
            assert self.server is not None
            self.procs.kill(self.server)
            await self.server.proc.wait()
            await self.control_pg.arestart()
            await self.start_server()
        return loop.time() - started

    # -- workers -----------------------------------------------------------------------
    async def start_worker(self, host: Host) -> Proc:
        home = self.folder(host.name)
        env = {
            **self.base_env(),
            "PREFECT_HOME": str(home / "prefect-home"),
            "PREFECT_LOCAL_STORAGE_PATH": str(home / "storage"),
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "2",
            "PAYMENTS_URL": self.payments_url,
        }
        # The pool's type given, so that a worker started while Prefect's server restarts
        # need not ask the API for it (it refuses to start otherwise: 17/67).
        argv = host.exec(PREFECT, "--no-prompt", "worker", "start", "--pool", POOL, "--type")
        argv += [
            "process",
            "--name",
            host.name,
            "--work-queue",
            "default",
            "--work-queue",
            host.name,
        ]
        proc = await self.procs.start(f"worker-{host.name}", *argv, env=env, cwd=home)
        self.workers[host.name] = proc
        return proc

    async def worker_ready(self, host: Host) -> None:
        await wait_for_line(self.workers[host.name], r"Worker .* started", STARTUP)

    async def kill_host(self, host: Host) -> list[int]:
        """SIGKILL every process of the host at once (its worker and every flow run).
        Cancelled mid-way, it finishes first: the killing thread goes on regardless, and
        would kill the worker the fault's undo starts (17/85, a lab error)."""
        return await to_the_end(self._kill_host(host))

    async def _kill_host(self, host: Host) -> list[int]:
        killed = await asyncio.to_thread(slots.kill_namespace, host.ns)
        worker = self.workers.get(host.name)
        if worker is not None:
            await worker.proc.wait()
        return killed

    # -- the store ---------------------------------------------------------------------
    @property
    def store_dsn(self) -> str:
        return self.store_pg.dsn


async def to_the_end(action: Coroutine[Any, Any, T]) -> T:
    """Run ``action`` to its end even if the caller is cancelled meanwhile (then raise
    the cancellation): a fault half done leaves the fleet broken for what follows."""
    task = asyncio.ensure_future(action)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


async def start_coder(fleet: Fleet) -> Coder:
    """The simulator on the Coder host's loopback, and its front door on the host's address."""
    host, folder = fleet.hosts["coder"], fleet.folder("coder")
    env = {**clean_env(), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    argv = host.exec(PREFECT_CODER, "simulator", "--host", "127.0.0.1", "--port", str(CODER_PORT))
    argv += ["--interrupt-winddown", "0.05", "--delta-interval", "0.005"]
    sim = await fleet.procs.start("simulator", *argv, env=env, cwd=folder)
    await wait_for_line(sim, r"^export CODER_ORG_ID=", STARTUP)
    exports = dict(re.findall(r"^export (\w+)=(.*)$", sim.output(), re.MULTILINE))
    values = {k: shlex.split(v)[0] for k, v in exports.items()}
    requests, impair = folder / "requests.jsonl", folder / "impair.json"
    impair.write_text("{}")
    listen, upstream = f"{host.address}:{CODER_PORT}", f"127.0.0.1:{CODER_PORT}"
    relay_argv = host.exec(PYTHON, "-m", "tests.fleet.relay", listen, upstream)
    relay = await fleet.procs.start(
        "relay", *relay_argv, str(requests), str(impair), env=env, cwd=ROOT
    )
    await wait_for_line(relay, "relay listening", STARTUP)
    url = f"http://{host.address}:{CODER_PORT}"
    return Coder(url, values["CODER_SESSION_TOKEN"], values["CODER_ORG_ID"], requests, impair)


async def build_network(slot: slots.Slot, workers: int) -> tuple[Network, dict[str, Host]]:
    net = Network(slot)
    await net.create()
    names = ["ctl", "coder", "store", *(f"w{n}" for n in range(1, workers + 1))]
    hosts = {name: await net.add_host(name, ADDRESSES[name]) for name in names}
    return net, hosts
