"""The stack the browser tests drive: the server with its UI on a PostgreSQL of the test's
own, the simulator, a CoderCredentials block saved as a user saves one, a process worker
with no CODER_* settings of its own (the block picked in a form is all it has), the
deployments from the shipped YAML, and a headless Chromium."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from playwright.async_api import Browser
from prefect.client.orchestration import PrefectClient, get_client
from prefect.settings import PREFECT_API_URL

from tests.prefect_test_api import api_settings

from .browser import chromium
from .procs import Proc, Processes
from .stack import (
    Server,
    coder_block,
    create_process_pool,
    deploy_all,
    home_env,
    start_server,
    start_simulator,
    start_worker,
)
from .ui_support import STARTUP_TIMEOUT, Clock


@dataclass
class UiStack:
    client: PrefectClient
    browser: Browser
    server: Server
    coder: dict[str, str]
    block_id: UUID
    #: The processes whose death fails the test at once: the server, the worker, the simulator.
    watch: list[Proc]
    clock: Clock


@contextlib.asynccontextmanager
async def ui_stack(
    procs: Processes,
    tmp: Path,
    browser_path: Path,
    database: str,
    block: str,
    worker_settings: dict[str, str],
) -> AsyncIterator[UiStack]:
    """The stack, deployed, with ``worker_settings`` added to the worker's environment.

    The server (no scheduler: only the runs a test makes happen) and the simulator start
    together, Chromium while the server does; the worker and the deployments side by side.
    """
    clock = Clock()
    env = home_env(tmp)
    server = await start_server(procs, tmp, env, database, ui=True)
    simulator, coder = await start_simulator(procs, env, tmp, STARTUP_TIMEOUT)
    async with chromium(browser_path) as browser:
        await server.healthy(STARTUP_TIMEOUT)
        clock.mark("server up")
        cli_env = {**env, "PREFECT_API_URL": server.api}
        async with api_settings({PREFECT_API_URL: server.api}), get_client() as client:
            await create_process_pool(client)
            block_id = await coder_block(coder).asave(block, overwrite=True, client=client)
            worker_env = {**cli_env, "PREFECT_WORKER_QUERY_SECONDS": "1", **worker_settings}
            worker = await start_worker(procs, worker_env, tmp)
            await deploy_all(procs, cli_env, [server.proc, worker])
            clock.mark("deployed")
            watch = [server.proc, worker, simulator]
            yield UiStack(client, browser, server, coder, block_id, watch, clock)
