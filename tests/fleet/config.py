"""The lab's timings and names: short, so that recovery takes seconds, not minutes."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from coder_chat.durable.sweep import SweepPolicy
from prefect_coder.settings import WorkflowSettings

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
#: The store's own database and role on the store host.
LEDGER_DATABASE = "coder_ledger"
LEDGER_ROLE = "coder_ledger"
API_PORT = 4200
CODER_PORT = 3000

#: Last octet of each host's address on the lab's subnet.
ADDRESSES = {"ctl": 10, "coder": 20, "store": 30, "w1": 41, "w2": 42, "w3": 43}


def _lab_workflow() -> WorkflowSettings:
    """A step's limits in the lab. A turn's silent stretch may last ``request_timeout``:
    the lab's sleeps (at most 6 s) must fit in it on two loaded cores, or every attempt
    is cut short and sent again. The deadline is longer than a step: a step checkpoints
    when it ends."""
    return WorkflowSettings(
        request_timeout_seconds=15.0, step_deadline_seconds=60.0, heartbeat_seconds=1.0
    )


def _lab_sweep() -> SweepPolicy:
    """What the sweep judges by in the lab: a running workflow silent for 10 s is
    stranded; a chat younger than 75 s (longer than a step's deadline) may be a step's
    that has not checkpointed yet."""
    return SweepPolicy(orphan_age=75.0, stuck_after=600.0, stale_heartbeat=10.0)


@dataclass(frozen=True)
class Timings:
    """Every limit the lab gives the product, in seconds: a step's (the product's own
    ``WorkflowSettings``), the sweep's judgement (the core's ``SweepPolicy``) and the
    sweep flow's schedule and relaunches."""

    workflow: WorkflowSettings = field(default_factory=_lab_workflow)
    sweep: SweepPolicy = field(default_factory=_lab_sweep)
    #: The sweep's schedule, overriding the YAML's every-5-minutes cron.
    sweep_interval: int = 20
    #: Generous: a campaign may strand one workflow several times over.
    max_relaunches: int = 10
    #: A relaunch (or any run Pending or Running) not begun by then is taken for lost (it
    #: may have landed on a host cut off from the store) and made again: a run starts in
    #: well under this here, on a machine of its own.
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

    @property
    def heartbeat(self) -> float:
        return self.workflow.heartbeat_seconds

    def workflow_settings(self) -> dict[str, float]:
        return self.workflow.model_dump(
            include={"request_timeout_seconds", "step_deadline_seconds", "heartbeat_seconds"}
        )

    def sweep_parameters(self) -> dict[str, object]:
        return {
            "target_deployment": "durable-chat",
            "orphan_age_seconds": self.sweep.orphan_age,
            "stuck_after_seconds": self.sweep.stuck_after,
            "stale_heartbeat_seconds": self.sweep.stale_heartbeat,
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
