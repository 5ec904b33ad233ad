"""The lab's timings and names: short, so that recovery takes seconds, not minutes."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: This virtualenv's binaries, by absolute path: every host runs the same install.
BIN = Path(sys.executable).parent
PREFECT = str(BIN / "prefect")
PREFECT_CODER = str(BIN / "prefect-coder")
PYTHON = sys.executable

POOL = "coder-agents"
DURABLE_CHAT = "durable-chat/durable-chat"
SWEEP = "orphan-sweep/orphan-sweep"
CHARGE_CARD = "prefect_coder.demo_tools:charge_card"
CREDENTIALS_SLUG = "prefect-coder-credentials/fleet"
LEDGER_SLUG = "prefect-coder-postgres-ledger/fleet"
LEDGER_SCHEMA = "fleet"
API_PORT = 4200
CODER_PORT = 3000

#: Last octet of each host's address on the lab's subnet.
ADDRESSES = {"ctl": 10, "coder": 20, "store": 30, "w1": 41, "w2": 42, "w3": 43}


@dataclass(frozen=True)
class Timings:
    """Every limit the lab gives the product, in seconds."""

    heartbeat: float = 1.0
    #: A running workflow silent for longer is stranded (the sweep relaunches it).
    stale_heartbeat: float = 10.0
    #: The sweep's schedule, overriding the YAML's every-5-minutes cron.
    sweep_interval: int = 20
    #: Longer than a step's deadline: a step checkpoints when it ends.
    orphan_age: float = 75.0
    stuck_after: float = 600.0
    #: A turn's silent stretch may last this long: the lab's sleeps (at most 6 s) must
    #: fit in it on two loaded cores, or every attempt is cut short and sent again.
    request_timeout: float = 15.0
    step_deadline: float = 60.0
    #: Generous: a campaign may strand one workflow several times over.
    max_relaunches: int = 10
    #: A relaunch not begun by then is taken for lost (it may have landed on a host cut
    #: off from the store) and made again: a run starts in well under this here.
    relaunch_start: float = 30.0
    #: A sweep pass lost with its host holds the next passes off this long (the pass's
    #: lease goes stale). Shorter than the sweep interval, so the next pass due takes
    #: over: with the flow's default (30 s, for a schedule every 5 minutes) a lost pass
    #: cost a whole extra interval here (schedule 15/87).
    sweep_lease: float = 10.0

    def __post_init__(self) -> None:
        if self.sweep_lease >= self.sweep_interval - self.heartbeat:
            raise ValueError(
                f"sweep_lease ({self.sweep_lease}s) must be shorter than the sweep interval "
                f"({self.sweep_interval}s) less a heartbeat, or a lost pass delays the next one"
            )

    def workflow_settings(self) -> dict[str, float]:
        return {
            "request_timeout_seconds": self.request_timeout,
            "step_deadline_seconds": self.step_deadline,
            "heartbeat_seconds": self.heartbeat,
        }

    def sweep_parameters(self) -> dict[str, object]:
        return {
            "target_deployment": "durable-chat",
            "orphan_age_seconds": self.orphan_age,
            "stuck_after_seconds": self.stuck_after,
            "stale_heartbeat_seconds": self.stale_heartbeat,
            "max_relaunches": self.max_relaunches,
            "relaunch_start_seconds": self.relaunch_start,
            "lease_seconds": self.sweep_lease,
            "tools": [CHARGE_CARD],
            "credentials": ref(CREDENTIALS_SLUG),
            "ledger": ref(LEDGER_SLUG),
        }


def ref(slug: str) -> dict[str, dict[str, str]]:
    """A saved block, as a deployment parameter names it."""
    return {"$ref": {"block_document_slug": slug}}
