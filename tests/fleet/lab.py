"""``open_fleet``: a whole fleet, up, for the length of a ``with`` block.

It claims a slot, builds the network and starts, each on its host: the two
private PostgreSQL servers, Prefect's server, the simulator and its front door,
the payments fake (in this process, on the bridge's address), the blocks, the
work pool and deployments (:mod:`.deploy`), the workers, and the witness.
Whatever happens, leaving the block tears all of it down (and so does the next
lab, if this process dies before it can).
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL

from prefect_coder.payments import serve_payments
from tests.integration.procs import Processes
from tests.lab.tasks import in_background
from tests.prefect_test_api import api_settings

from . import slots
from .config import LEDGER_DATABASE, LEDGER_ROLE, LEDGER_SCHEMA, Timings
from .deploy import create_pool, deploy
from .door import knock
from .fleet import Fleet, build_network, start_coder
from .pg import HostPg, Setup, ledger_grants, prefect_grants
from .witness import Witness


@contextlib.asynccontextmanager
async def open_fleet(
    root: Path,
    workers: int = 3,
    timings: Timings | None = None,
    *,
    keep: bool = False,
    say: Callable[[str], None] = print,
    sweep_queue: str = "default",
) -> AsyncIterator[Fleet]:
    """A running fleet (this process's Prefect settings pointing at its server); torn
    down on the way out, whatever happened."""
    slot = await asyncio.to_thread(_claim, root)
    try:
        async with AsyncExitStack() as stack:
            fleet = await _fleet(stack, root, slot, workers, timings or Timings())
            fleet.sweep_queue, fleet.say = sweep_queue, say
            settings = {PREFECT_API_URL: fleet.api_url, PREFECT_API_AUTH_STRING: fleet.auth_string}
            await stack.enter_async_context(api_settings(settings))
            await _start(fleet, say)
            fleet.door = await knock(fleet)
            say(f"fleet: Prefect's API {fleet.door.describe()}")
            fleet.witness = Witness(fleet.worker_hosts)
            await stack.enter_async_context(in_background(fleet.witness.watch()))
            yield fleet
    finally:
        await asyncio.to_thread(slots.release, slot, keep_root=keep)


def _claim(root: Path) -> slots.Slot:
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # the PostgreSQL servers run as "postgres", below this folder
    if (closed := closed_to_others(root)) is not None:
        raise RuntimeError(
            f"the fleet's folder {root} is below {closed}, which other users may not enter "
            f"(mode {closed.stat().st_mode & 0o777:o}): its PostgreSQL servers run as "
            "'postgres' and must reach their data there; give a --workdir under /tmp"
        )
    return slots.claim(root)


def closed_to_others(folder: Path) -> Path | None:
    """The first folder above ``folder`` that other users may not pass through, if any."""
    for parent in reversed(folder.resolve().parents):
        if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
            return parent
    return None


async def _fleet(
    stack: AsyncExitStack, root: Path, slot: slots.Slot, workers: int, timings: Timings
) -> Fleet:
    """The network and the lab's own pieces; no host runs anything yet."""
    net, hosts = await build_network(slot, workers)
    procs = Processes(root / "logs")
    procs.root.mkdir(exist_ok=True)
    stack.push_async_callback(procs.close)
    ctl, store = hosts["ctl"], hosts["store"]
    # Prefect's database serves Prefect's server alone: on the control host's loopback.
    local = "127.0.0.1"
    prefect = Setup(local, "prefect", "postgres", f"{local}/32", prefect_grants("prefect"))
    control_pg = HostPg(root / "ctl" / "pg", ctl, replace(prefect, for_prefect=True))
    # The store is reached from every worker host: over TLS, by its own role.
    grants = ledger_grants(LEDGER_DATABASE, LEDGER_SCHEMA, LEDGER_ROLE)
    ledger = Setup(store.address, LEDGER_ROLE, LEDGER_DATABASE, f"{slot.address(0)}/24", grants)
    store_pg = HostPg(root / "store" / "pg", store, replace(ledger, statement_log=True, tls=True))
    url, payments = await stack.enter_async_context(serve_payments(net.gateway))
    return Fleet(root, slot, net, hosts, procs, timings, control_pg, store_pg, payments, url)


async def _start(fleet: Fleet, say: Callable[[str], None]) -> None:
    """Every host's services, as much at once as their order allows."""
    clock = asyncio.get_running_loop().time
    started = clock()

    def done(what: str) -> None:
        say(f"fleet: {what} ({clock() - started:.1f}s)")

    await asyncio.gather(fleet.control_pg.astart(), fleet.store_pg.astart())
    done("both PostgreSQL servers up")
    fleet.coder, _ = await asyncio.gather(start_coder(fleet), fleet.start_server())
    done("Prefect's server and the simulator up")
    await create_pool(fleet)

    async def workers() -> None:
        await asyncio.gather(*(fleet.start_worker(h) for h in fleet.worker_hosts))
        await asyncio.gather(*(fleet.worker_ready(h) for h in fleet.worker_hosts))
        done(f"{len(fleet.worker_hosts)} workers started")

    async def deployments() -> None:
        await deploy(fleet)
        done("blocks saved, deployments created")

    await asyncio.gather(workers(), deployments())
