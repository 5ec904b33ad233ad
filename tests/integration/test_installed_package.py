"""The built wheel, installed into a fresh virtualenv inside a Prefect project of its own.

The project has its own ``flows``, ``tasks`` and ``blocks`` packages, as most Prefect
projects do; nothing we install may shadow them. Everything runs from the fresh
virtualenv and the project's folder, under an empty home: a ``prefect server``, the
simulator, block registration by module, a process worker, and two deployments from
the project's own ``prefect.yaml``: the project's flow, which takes durable turns with
``DurableChat`` and calls the project's own task between them, and our ``durable_chat``
by module path. Both runs must complete. (uv builds and installs the wheel: the same
wheel ``pip`` would install, in seconds rather than minutes.)
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import zipfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from textwrap import dedent

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterName,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import StateType
from prefect.settings import PREFECT_API_URL

from tests.integration.procs import (
    Proc,
    Processes,
    clean_env,
    free_port,
    managed_processes,
    wait_for_line,
)
from tests.integration.stack import ROOT, start_simulator
from tests.prefect_test_api import api_settings

STARTUP_TIMEOUT = 240.0
STEP_TIMEOUT = 600.0

pytestmark = pytest.mark.timeout(1500)

#: The user's project: their flow, their own tasks and blocks packages, their deployments.
PROJECT = {
    "flows/__init__.py": "",
    "flows/refunds.py": """
        from prefect import flow

        from blocks import SHOP
        from prefect_coder import CoderCredentials, DurableChat
        from tasks import audit


        @flow(name="shop-refund")
        async def refund(order_id: str, credentials: CoderCredentials | None = None) -> str:
            async with DurableChat(f"shop-refund-{order_id}", credentials=credentials) as chat:
                plan = await chat.turn(f"Plan the refund of order {order_id} at {SHOP}")
                await audit(plan.text)
                done = await chat.turn("Confirm the refund")
            return done.text
        """,
    "tasks/__init__.py": """
        from prefect import get_run_logger, task


        @task
        async def audit(text: str) -> str:
            get_run_logger().info(f"audited by the shop's own task: {text}")
            return text
        """,
    "blocks/__init__.py": 'SHOP = "the corner shop"\n',
    "prefect.yaml": """
        name: shop
        prefect-version: 3.9.1
        pull:
          - prefect.deployments.steps.set_working_directory:
              directory: {project}
        deployments:
          - name: shop-refunds
            entrypoint: flows/refunds.py:refund
            work_pool: {name: shop-pool}
          - name: shop-chats
            entrypoint: prefect_coder.flows.durable_chat:durable_chat
            work_pool: {name: shop-pool}
        """,
}


def write_project(where: Path) -> Path:
    project = where / "shop"
    for name, text in PROJECT.items():
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text).lstrip().replace("{project}", str(project)))
    return project


def fresh_env(tmp: Path, venv: Path, port: int) -> dict[str, str]:
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    ours = str(Path(sys.prefix) / "bin")
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != ours)
    return {
        **clean_env(),
        "HOME": str(home),
        "PATH": f"{venv / 'bin'}{os.pathsep}{path}",
        "VIRTUAL_ENV": str(venv),
        "PREFECT_HOME": str(home / ".prefect"),
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_CODER_SQLITE_PATH": str(tmp / "ledger.sqlite3"),
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
    }


async def test_the_wheel_serves_a_project_with_its_own_flows_tasks_and_blocks(
    tmp_path: Path,
) -> None:
    async with managed_processes(tmp_path) as procs:
        await scenario(procs, tmp_path)


async def install_the_wheel(procs: Processes, tmp: Path) -> Path:
    """The project's wheel, built and installed into a fresh virtualenv (returned)."""
    dist, venv = tmp / "dist", tmp / "venv"
    base = {**clean_env(), "PYTHONUNBUFFERED": "1"}
    uv = str(Path(sys.prefix) / "bin" / "uv")
    await procs.run(
        "wheel", uv, "build", "--quiet", "--wheel", "--out-dir", str(dist), str(ROOT),
        env=base, cwd=tmp, timeout=STEP_TIMEOUT,
    )  # fmt: skip
    [wheel] = dist.glob("prefect_coder-*.whl")
    with zipfile.ZipFile(wheel) as files:  # served by a team whose browsers are offline
        assert "prefect_coder/blocks/logo.png" in files.namelist()
    await procs.run("venv", uv, "venv", "--quiet", str(venv), env=base, cwd=tmp)
    # Compiled as pip compiles what it installs: else the server, the simulator and the
    # CLI, started side by side, each compile the same modules on their first import.
    await procs.run(
        "install",
        uv, "pip", "install", "--quiet", "--compile-bytecode",
        "--python", str(venv / "bin" / "python"),
        "-c", str(ROOT / "constraints.txt"), str(wheel),
        env=base, cwd=tmp, timeout=STEP_TIMEOUT,
    )  # fmt: skip
    return venv


async def scenario(procs: Processes, tmp: Path) -> None:
    venv = await install_the_wheel(procs, tmp)
    project = write_project(tmp)
    port = free_port()
    env = fresh_env(tmp, venv, port)

    async def sh(name: str, script: str, watch: list[Proc]) -> str:
        return await procs.run(
            name,
            "bash",
            "-ec",
            dedent(script),
            env=env,
            cwd=project,
            timeout=STEP_TIMEOUT,
            watch=watch,
        )

    server = await procs.start("server", "prefect", "server", "start", env=env, cwd=project)
    # The installed package's simulator, found on the fresh environment's PATH.
    simulator, coder = await start_simulator(procs, env, project, STARTUP_TIMEOUT, "prefect-coder")
    watch = [server, simulator]
    await sh(
        "imports",
        "python -c 'import flows, tasks, blocks; assert blocks.SHOP and tasks.audit'",
        watch,
    )
    await sh("server-ready", "prefect server status --wait --timeout 240", watch)

    # Independent of each other, so side by side: the blocks, and the pool with its
    # worker and the deployments.
    _, worker = await asyncio.gather(
        register_blocks(sh, coder, watch),
        pool_worker_and_deployments(sh, procs, env, project, watch),
    )
    credentials = json.dumps({"$ref": {"block_document_slug": "prefect-coder-credentials/shop"}})
    await sh(
        "runs",
        f"""
        prefect deployment run shop-refund/shop-refunds --watch \\
          --param order_id=A41 --param credentials={shlex.quote(credentials)}
        prefect deployment run durable-chat/shop-chats --watch \\
          --param workflow_id=shop-chat --param prompts='["Say hello", "Say goodbye"]' \\
          --param credentials={shlex.quote(credentials)}
        """,
        [*watch, worker],
    )
    async with api_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
        await check_the_runs()


#: Runs a bash script in the project's folder and fresh environment: its name, the script,
#: the processes that must stay up meanwhile.
Shell = Callable[[str, str, list[Proc]], Awaitable[str]]


async def register_blocks(sh: Shell, coder: dict[str, str], watch: list[Proc]) -> None:
    """Our block types registered by module, and the simulator's credentials saved."""
    await sh(
        "blocks",
        f"""
        prefect block register -m prefect_coder.blocks
        python - <<'EOF'
        from prefect_coder import CoderCredentials
        CoderCredentials(
            base_url={coder["CODER_URL"]!r},
            token={coder["CODER_SESSION_TOKEN"]!r},
            organization_id={coder["CODER_ORG_ID"]!r},
        ).save("shop", overwrite=True)
        EOF
        """,
        watch,
    )


async def pool_worker_and_deployments(
    sh: Shell, procs: Processes, env: dict[str, str], project: Path, watch: list[Proc]
) -> Proc:
    """The pool, a worker polling it (returned once started) and the project's deployments."""
    await sh("pool", "prefect work-pool create shop-pool --type process", watch)
    # A worker asks for work every PREFECT_WORKER_QUERY_SECONDS: 10 s unless lowered, as
    # the docs tell (docs/sweep.md).
    worker_env = {**env, "PREFECT_WORKER_QUERY_SECONDS": "1"}
    worker = await procs.start(
        "worker", "prefect", "worker", "start", "--pool", "shop-pool", env=worker_env, cwd=project
    )
    await sh("deploy", "prefect --no-prompt deploy --all", [*watch, worker])
    await wait_for_line(worker, "Worker .* started", STARTUP_TIMEOUT)
    return worker


async def check_the_runs() -> None:
    async with get_client() as client:
        for deployment, name in (
            ("shop-refunds", "shop-refund-A41 · epoch 1"),
            ("shop-chats", "shop-chat · epoch 1"),
        ):
            [run] = await client.read_flow_runs(
                deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment]))
            )
            assert run.state is not None and run.state.type == StateType.COMPLETED, run.state
            assert run.name == name
        [refund] = await client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["shop-refunds"]))
        )
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[refund.id])), limit=200
        )
    messages = [g.message for g in logs]
    assert any(
        m.startswith("audited by the shop's own task: ") and "the corner shop" in m
        for m in messages
    ), messages
    assert any(m.startswith("Finished in state Completed('Step 2: ran") for m in messages), messages
