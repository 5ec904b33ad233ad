"""The session token must be nowhere our side wrote: the places a lab searches for it.

The store's files, the Prefect homes (persisted results), the children's output, and
what the Prefect API keeps (artifacts, log lines, flow-run parameters).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter
from prefect.client.schemas.sorting import FlowRunSort

from .children import Child, CrashLab


async def searched_places(lab: CrashLab) -> dict[str, bytes]:
    """Every place the token must never reach, by name: the store's files, the
    ``PREFECT_HOME`` tree (persisted results), the children's output, and what the API
    keeps (artifacts, log lines, flow-run parameters)."""
    places: dict[str, bytes] = {}
    for path in sorted(lab.root.glob(f"{lab.db.name}*")):
        places[f"store {path.name}"] = path.read_bytes()
    # every machine's Prefect home
    places.update(home_places(lab.root, sorted(lab.root.glob("*prefect-home"))))
    places.update(child_places(lab.children))
    async with get_client() as client:
        for artifact in await client.read_artifacts():
            places[f"artifact {artifact.id} {artifact.key}"] = str(artifact.data).encode()
        offset = 0
        while True:
            logs = await client.read_logs(LogFilter(), limit=200, offset=offset)
            for log in logs:
                places[f"log {log.id}"] = log.message.encode()
            if len(logs) < 200:
                break
            offset += 200
        for run in await client.read_flow_runs(
            sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=200
        ):
            places[f"flow run {run.id} parameters"] = json.dumps(run.parameters).encode()
    return places


async def check_no_token(lab: CrashLab) -> dict[str, bytes]:
    """The token is in no store row, persisted result, log line or artifact."""
    places = await searched_places(lab)
    assert lab.db.exists() and any(name.startswith("home ") for name in places)
    leaks = leaking(places, lab.sim.token)
    assert not leaks, f"the session token leaked into: {leaks}"
    return places


def home_places(root: Path, homes: Iterable[Path]) -> dict[str, bytes]:
    """Every file under the Prefect homes (persisted results among them), named from ``root``."""
    return {
        f"home {path.relative_to(root)}": path.read_bytes()
        for home in homes
        if home.exists()
        for path in sorted(p for p in home.rglob("*") if p.is_file())
    }


def child_places(children: Iterable[Child]) -> dict[str, bytes]:
    """What every child process printed."""
    places: dict[str, bytes] = {}
    for child in children:
        places[f"{child.name} stdout"] = child.stdout.read_bytes()
        places[f"{child.name} stderr"] = child.stderr.read_bytes()
    return places


def leaking(places: dict[str, bytes], token: str) -> list[str]:
    """The names of the places that hold ``token``."""
    needle = token.encode()
    return [name for name, data in places.items() if needle in data]
