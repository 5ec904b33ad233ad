"""Blocks, the work pool and the deployments, set up as an operator on the control host would.

The blocks (``CoderCredentials`` for the simulator's front door, ``PostgresLedger``
for the store host) are saved through the API. The deployments come from
``deployments/prefect.yaml`` itself, copied with the lab's overrides: the sweep
runs every ``sweep_interval`` seconds instead of every 5 minutes, with the lab's
short limits and the saved blocks as parameters; ``prefect deploy`` runs on the
control host. The work pool is created through the API (the CLI's five seconds of
imports are better spent on the workers), with a queue per worker host beside the
default one: a scenario can start a workflow on the host it chooses, and a
relaunch goes to the default queue, which every worker polls.
"""

from __future__ import annotations

import json
from typing import Any

import yaml  # type: ignore[import-untyped]
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from pydantic import SecretStr

from prefect_coder.blocks import CoderCredentials, PostgresLedger

from .config import LEDGER_SCHEMA, POOL, PREFECT, ROOT
from .fleet import Fleet

SOURCE = ROOT / "deployments" / "prefect.yaml"
SWEEP_NAME = "orphan-sweep"


def lab_yaml(fleet: Fleet) -> dict[str, Any]:
    """``deployments/prefect.yaml`` with the sweep's schedule, parameters and queue overridden."""
    config: dict[str, Any] = yaml.safe_load(SOURCE.read_text())
    for deployment in config["deployments"]:
        if deployment["name"] == SWEEP_NAME:
            deployment["parameters"] = fleet.timings.sweep_parameters()
            deployment["schedules"] = [
                {"interval": fleet.timings.sweep_interval, "slug": "fleet-lab-sweep"}
            ]
            # A copy: the YAML's deployments share one work_pool mapping (an anchor).
            deployment["work_pool"] = {
                **deployment["work_pool"],
                "work_queue_name": fleet.sweep_queue,
            }
    return config


async def create_pool(fleet: Fleet) -> None:
    """The process work pool, and a queue per worker host besides its default queue."""
    async with get_client() as client:
        await client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
        for host in fleet.worker_hosts:
            await client.create_work_queue(name=host.name, work_pool_name=POOL)


async def deploy(fleet: Fleet) -> None:
    """Save the blocks, then ``prefect deploy`` the lab's copy of the YAML on the control host."""
    ctl, folder = fleet.hosts["ctl"], fleet.folder("ctl")
    env = {**fleet.base_env(), "PREFECT_HOME": str(folder / "cli-home")}
    await save_blocks(fleet)
    prefect_file = folder / "prefect.yaml"
    prefect_file.write_text(json.dumps(lab_yaml(fleet), indent=2))  # JSON is YAML too
    argv = ctl.exec(PREFECT, "--no-prompt", "deploy", "--all", "--prefect-file", str(prefect_file))
    await fleet.procs.run("deploy", *argv, env=env, cwd=ROOT, timeout=180)


async def save_blocks(fleet: Fleet) -> None:
    """Save the blocks through the API (the caller's settings point at the fleet's)."""
    coder = fleet.coder
    assert coder is not None
    await CoderCredentials(
        base_url=coder.url,
        token=SecretStr(coder.token),
        organization_id=coder.organization_id,
    ).asave("fleet", overwrite=True)
    await PostgresLedger(dsn=SecretStr(fleet.store_dsn), db_schema=LEDGER_SCHEMA).asave(
        "fleet", overwrite=True
    )
