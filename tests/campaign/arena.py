"""Everything one schedule runs against, and how its children are started.

Each schedule has its own simulator (in-process, short timers), payments fake,
folder, store and crash lab; all schedules share the one Prefect API.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coder_chat.durable.store import DurableStore
from coder_chat.simulator import Simulator
from tests.lab.children import CHARGE_CARD, CrashLab
from tests.lab.steps import Schedule, WorkflowPlan
from tests.lab.truth import StatusLog

from .admin import Admin
from .approvals import Approver
from .gate import ChargeGate
from .refunds import params_of
from .stores import StoreSite

#: Seconds a turn's segment may take: horizons and retries cost seconds, not minutes.
REQUEST_TIMEOUT = 6.0
STEP_DEADLINE = 40.0


@dataclass
class Arena:
    schedule: Schedule
    root: Path
    sim: Simulator
    lab: CrashLab
    admin: Admin
    gate: ChargeGate
    site: StoreSite
    store: DurableStore
    statuses: StatusLog = field(default_factory=StatusLog)
    #: What happened that the plan alone does not say (restarts done, kills not reached).
    notes: list[str] = field(default_factory=list)
    #: What the final sweep reported, chat by chat.
    sweep_lines: list[str] = field(default_factory=list)
    #: Tasks that outlive a run (a held send released late); cancelled with the schedule.
    background: list[asyncio.Task[None]] = field(default_factory=list)
    #: When each run of the first workflow was let go (Postgres restarts are timed from them).
    go_times: list[float] = field(default_factory=list)
    #: Set once every workflow has ended.
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    #: Who answers each refund workflow's pauses, by workflow id.
    approvers: dict[str, Approver] = field(default_factory=dict)
    #: The chats that were archived when the workflows had ended, before the sweep.
    archived_before_sweep: set[str] = field(default_factory=set)
    #: Postgres restarts done so far (a person waits for those due before acting).
    restarts_done: int = 0

    def __post_init__(self) -> None:
        # Prefect creates its home folder, but not the folders above it.
        self.second_machine.mkdir(exist_ok=True)

    @property
    def second_machine(self) -> Path:
        return self.root / "machine-2"

    @property
    def tenant(self) -> str:
        return str(self.sim.organization_id)

    def params(self, plan: WorkflowPlan) -> dict[str, Any]:
        """The child's parameters for every run of ``plan``: ``durable_chat``'s, or the
        refund flow's."""
        if plan.refund is not None:
            params = params_of(plan.refund)
            if self.site.ledger_block:
                params["ledger"] = self.site.ledger_block
            return params
        params = {
            "workflow_id": plan.workflow_id,
            "prompts": plan.prompts,
            "tools": [CHARGE_CARD],
            "request_timeout_seconds": REQUEST_TIMEOUT,
            "step_deadline_seconds": STEP_DEADLINE,
        }
        if plan.output_schemas:
            params["output_schemas"] = plan.output_schemas
        if self.site.ledger_block:
            params["ledger"] = self.site.ledger_block
        return params

    def machine_env(self, run: int) -> dict[str, str]:
        """A second-machine schedule alternates its runs between two machines, each with
        its own Prefect home and result storage (same API, same store)."""
        if self.schedule.variant != "second-machine" or run % 2 == 1:
            return {}
        machine = self.second_machine
        return {
            "PREFECT_HOME": str(machine / "prefect-home"),
            "PREFECT_LOCAL_STORAGE_PATH": str(machine / "storage"),
        }

    def homes(self) -> list[Path]:
        """Every folder a child's Prefect wrote to (homes and result storage)."""
        return [self.lab.home, self.second_machine]
