"""Where the Coder session token must never be found on the fleet.

It may be in two places only: the credentials block (Prefect keeps its value encrypted
in its database) and what Coder itself keeps (the simulator, on the Coder host). So the
lab searches every row of Prefect's database (flow-run parameters, logs, artifacts,
results, events, the block's stored value), every row of the store's, and every file
the fleet's hosts wrote: the databases' own files, the workers' Prefect homes and
persisted results, every process's output; everything under the fleet's folder but the
Coder host's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from tests.lab.leaks import leaking

from .config import LEDGER_DATABASE
from .fleet import Fleet

#: The process logs of Coder's own side: it is where the token comes from.
CODER_SIDE = ("simulator", "relay")


async def token_leaks(fleet: Fleet) -> list[str]:
    """The places that hold the Coder token, by name (none, when all is well)."""
    coder = fleet.coder
    assert coder is not None
    databases = {
        "Prefect's database": await fleet.control_pg.adump("postgres"),
        "the store's database": await fleet.store_pg.adump(LEDGER_DATABASE),
    }
    found = leaking(databases, coder.token)
    files = await asyncio.to_thread(files_holding, fleet.root, coder.token.encode(), ours)
    return found + [f"file {path.relative_to(fleet.root)}" for path in files]


def ours(root: Path, path: Path) -> bool:
    """Whether ``path`` was written by our side of the fleet (not by Coder's)."""
    first = path.relative_to(root).parts[0]
    if first == "coder":
        return False
    return not (first == "logs" and any(f"-{name}." in path.name for name in CODER_SIDE))


def files_holding(root: Path, needle: bytes, searched: Callable[[Path, Path], bool]) -> list[Path]:
    """Every file below ``root`` that ``searched(root, path)`` admits and that holds
    ``needle`` (a file that vanished meanwhile holds nothing)."""
    found = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.is_symlink() or not searched(root, path):
            continue
        try:
            data = path.read_bytes()
        except (FileNotFoundError, PermissionError):
            continue
        if needle in data:
            found.append(path)
    return found
