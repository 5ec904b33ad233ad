"""The pieces of a real Prefect stack the integration tests start: the processes' shared
environment, ``prefect server start`` on a PostgreSQL of the test's own, ``prefect-coder
simulator`` and its ``CODER_*`` variables, the process pool, workers, and ``prefect deploy
--all`` from the shipped YAML.

Each test composes them in its own order (the server and the simulator start side by
side, so a test waits for the server's health only after both were started).
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.workers.process import ProcessWorker

from prefect_coder.blocks import CoderCredentials
from tests.prefect_test_api import migrated_sqlite

from .procs import Proc, Processes, clean_env, free_port, http_ok, until, wait_for_line

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PREFECT = str(BIN / "prefect")
POOL = "coder-agents"
#: The pool, flows and triggers every deployment of the shipped YAML is made from.
SHIPPED_YAML = "deployments/prefect.yaml"


def home_env(tmp: Path) -> dict[str, str]:
    """The environment every process shares: this one's without Prefect or Coder settings,
    a home of their own under ``tmp`` (Prefect's in it), and no telemetry."""
    (tmp / "home").mkdir(exist_ok=True)
    return {
        **clean_env(),
        "HOME": str(tmp / "home"),
        "PREFECT_HOME": str(tmp / "home" / ".prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }


@dataclass
class Server:
    """``prefect server start`` (no scheduler: only the runs a test or a trigger makes happen)."""

    proc: Proc
    #: Where the server (and its UI, when it serves one) answers.
    url: str

    @property
    def api(self) -> str:
        return f"{self.url}/api"

    async def healthy(self, timeout: float) -> None:
        async def answers() -> bool:
            return await http_ok(f"{self.api}/health")

        await until(answers, "the server's /api/health", timeout, [self.proc], interval=0.5)


async def start_server(
    procs: Processes, tmp: Path, env: dict[str, str], database: str | None, ui: bool = False
) -> Server:
    """Start the server on a free port, its database the PostgreSQL at ``database`` (None:
    Prefect's own SQLite file under ``PREFECT_HOME``, there already as a copy of one its
    migrations ran on, :func:`~tests.prefect_test_api.migrated_sqlite`: seconds of its start).

    The port is a setting, not ``--port``: with ``--port`` alone the UI would look for the
    API on 4200.
    """
    port = free_port()
    server_env = {
        **env,
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
    }
    if database is None:  # the first copy waits for the migrations: not on this loop
        await asyncio.to_thread(_migrated_sqlite_in, Path(env["PREFECT_HOME"]))
    else:
        async_url = database.replace("postgresql://", "postgresql+asyncpg://", 1)
        server_env["PREFECT_API_DATABASE_CONNECTION_URL"] = async_url
    argv = ["server", "start", "--no-scheduler", *([] if ui else ["--no-ui"])]
    proc = await procs.start("server", PREFECT, *argv, env=server_env, cwd=tmp)
    return Server(proc, f"http://127.0.0.1:{port}")


def _migrated_sqlite_in(home: Path) -> None:
    """Prefect's SQLite file in ``home``, where Prefect keeps it: a copy of a migrated one."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated_sqlite(), home / "prefect.db")


async def start_simulator(
    procs: Processes,
    env: dict[str, str],
    cwd: Path,
    timeout: float,
    program: str = str(BIN / "prefect-coder"),
) -> tuple[Proc, dict[str, str]]:
    """``prefect-coder simulator`` (this environment's, unless ``program`` names another)
    and the ``CODER_*`` variables it prints for its users."""
    argv = ["simulator", "--port", "0"]
    proc = await procs.start("simulator", program, *argv, env=env, cwd=cwd)
    await wait_for_line(proc, r"^export CODER_ORG_ID=", timeout)
    coder = dict(
        shlex.split(line)[1].split("=", 1)
        for line in proc.output().splitlines()
        if line.startswith("export ")
    )
    return proc, coder


async def create_process_pool(client: PrefectClient, name: str = POOL) -> None:
    """The pool as ``prefect work-pool create --type process`` makes it."""
    template = ProcessWorker.get_default_base_job_template()
    await client.create_work_pool(
        WorkPoolCreate(name=name, type="process", base_job_template=template)
    )


async def start_worker(
    procs: Processes, env: dict[str, str], cwd: Path, name: str = "worker", pool: str = POOL
) -> Proc:
    """A process worker polling ``pool`` (``--name`` is the process's name too)."""
    argv = ["--no-prompt", "worker", "start", "--pool", pool, "--name", name]
    return await procs.start(name, PREFECT, *argv, env=env, cwd=cwd)


async def deploy_all(
    procs: Processes, env: dict[str, str], watch: list[Proc], timeout: float = 120.0
) -> str:
    """``prefect deploy --all`` from the shipped YAML, run from the project's root."""
    argv = ["--no-prompt", "deploy", "--all", "--prefect-file", SHIPPED_YAML]
    return await procs.run(
        "deploy", PREFECT, *argv, env=env, cwd=ROOT, watch=watch, timeout=timeout
    )


def coder_block(coder: dict[str, str]) -> CoderCredentials:
    """The credentials block a user would save for the simulator's ``CODER_*`` variables."""
    return CoderCredentials(
        base_url=coder["CODER_URL"],
        token=coder["CODER_SESSION_TOKEN"],
        organization_id=coder["CODER_ORG_ID"],
    )
