"""The payments fake's hold knob, aimed: kill a run inside its n-th charge.

Every charge is held at both hold points (before and after its effect). The gate
lets each one through at once, unless a run's kill targets it: then it stays held
until the child running the workflow is dead. A re-run's re-drive of a crashed
charge is a charge of that run like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from coder_chat.durable.markers import LABEL_WORKFLOW
from coder_chat.simulator import Simulator
from coder_chat.simulator.errors import ApiError
from prefect_coder.payments import HeldCharge, Ledger
from tests.lab.steps import Phase
from tests.lab.tasks import in_background

#: Hold rules armed per hold point: far more charges than any schedule makes.
HOLDS = 1000


@dataclass
class ChargeTarget:
    workflow_id: str
    nth: int
    phase: Phase
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    held: HeldCharge | None = None
    key: str = ""


@dataclass
class ChargeGate:
    payments: Ledger
    sim: Simulator
    #: Charges each workflow's current run has made so far.
    counts: dict[str, int] = field(default_factory=dict)
    targets: dict[str, ChargeTarget] = field(default_factory=dict)
    _seen: set[int] = field(default_factory=set)

    @contextlib.asynccontextmanager
    async def holding(self) -> AsyncIterator[ChargeGate]:
        self.payments.hold("before", HOLDS)
        self.payments.hold("after", HOLDS)
        try:
            async with in_background(self._serve()):
                yield self
        finally:
            self.payments.clear()

    def new_run(self, workflow_id: str) -> None:
        self.counts[workflow_id] = 0
        self.targets.pop(workflow_id, None)

    def aim(self, workflow_id: str, nth: int, phase: Phase) -> ChargeTarget:
        target = ChargeTarget(workflow_id, nth, phase)
        self.targets[workflow_id] = target
        return target

    def settle(self, target: ChargeTarget) -> None:
        """After the kill: a charge held before its effect is dropped (never applied),
        one held after it is released (applied, its answer lost with the process)."""
        self.targets.pop(target.workflow_id, None)
        if target.held is not None and target.held.outcome is None:
            self.payments.decide(target.held.id, "drop" if target.phase == "before" else "release")

    async def _serve(self) -> None:
        while True:
            for held in self.payments.held():
                if held.id not in self._seen:
                    self._seen.add(held.id)
                    self._route(held)
            await asyncio.sleep(0.003)

    def _route(self, held: HeldCharge) -> None:
        workflow_id = self._workflow_of(held.key)
        target = self.targets.get(workflow_id)
        if held.phase == "before":
            self.counts[workflow_id] = self.counts.get(workflow_id, 0) + 1
            if target and not target.key and self.counts[workflow_id] == target.nth:
                target.key = held.key
        aimed = target and target.key == held.key and target.phase == held.phase
        if target and aimed and not target.reached.is_set():
            target.held = held
            target.reached.set()
            return
        self.payments.decide(held.id, "release")

    def _workflow_of(self, key: str) -> str:
        # Keys are "<tenant>/<chat_id>/<tool_call_id>"; the chat carries the workflow label.
        parts = key.split("/")
        try:
            return self.sim.chat(parts[1]).labels.get(LABEL_WORKFLOW, "")
        except (IndexError, ValueError, ApiError):
            return ""
