"""What the tests of code that changes under running workflows write as a team would: a
two-step review flow's source, and the environment its serving process runs in."""

from __future__ import annotations

from pathlib import Path

from prefect.settings import PREFECT_API_URL

from coder_chat.simulator import Simulator

from .procs import clean_env

#: A review flow in a team's own file: read, a second step the test chooses, sum up.
REVIEW_SOURCE = """\
from prefect import flow
from prefect_coder import DurableChat


@flow(name={flow!r}, version={version!r})
async def review(workflow_id: str) -> list[str]:
    async with DurableChat(workflow_id) as chat:
        await chat.turn({read!r})
{second}
        await chat.turn({sum!r})
    return [r.verdict for r in chat.results]
"""


def serving_env(sim: Simulator, home: Path, ledger: Path, **more: str) -> dict[str, str]:
    """A serving process's environment: none of this one's Prefect or Coder settings,
    the simulator's, the test API, its own Prefect home and the embedded store at
    ``ledger``; ``more`` on top."""
    return {
        **clean_env(),
        **sim.env(),
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PREFECT_CODER_SQLITE_PATH": str(ledger),
        "PYTHONUNBUFFERED": "1",
        **more,
    }
