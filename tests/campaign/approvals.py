"""A person answering a workflow's paused flow runs, through Prefect's API.

``refund_order`` pauses its flow run (``apause_flow_run(wait_for_input=Approval)``)
above its limit. An :class:`Approver` watches the API for paused runs of one
workflow (its runs are named ``<workflow_id> · epoch N``) and resumes each with
the same answer, as one person deciding once would: every relaunch is a new flow
run that asks again. A kill during the pause asks it to :meth:`~Approver.hold` the
next run's pause instead: the run is left waiting until it is killed, and its
pause is never answered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

import httpx
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterName,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.exceptions import PrefectException
from prefect.flow_runs import aresume_flow_run

from coder_chat.durable.records import utcnow
from tests.lab.tasks import in_background

POLL = 0.5


@dataclass
class Approver:
    workflow_id: str
    approved: bool
    #: Seconds between seeing a run paused and answering it.
    answer_after: float = 0.0
    #: The runs answered, in order.
    answered: list[UUID] = field(default_factory=list)
    #: Runs never to answer (killed while their pause was held).
    dead: set[UUID] = field(default_factory=set)
    _seen: dict[UUID, float] = field(default_factory=dict)
    _hold_since: datetime | None = None
    _held: asyncio.Queue[UUID] = field(default_factory=asyncio.Queue)

    # -- a kill during the pause ---------------------------------------------------------
    def hold(self) -> None:
        """Leave the next pause of a run created from now on unanswered, for :meth:`held`."""
        self._hold_since = utcnow()
        self._held = asyncio.Queue()

    async def held(self) -> UUID:
        """The run whose pause is held, once it is paused."""
        return await self._held.get()

    def let_go(self, dead: UUID | None = None) -> None:
        """Stop holding; ``dead`` (a killed run) is never answered."""
        self._hold_since = None
        if dead is not None:
            self.dead.add(dead)

    # -- watching -------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[Approver]:
        async with in_background(self.watch()):
            yield self

    async def watch(self) -> None:
        while True:
            with contextlib.suppress(httpx.HTTPError, PrefectException):
                for run in await self.paused_runs():
                    await self._consider(run)
            await asyncio.sleep(POLL)

    async def paused_runs(self) -> list[FlowRun]:
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    name=FlowRunFilterName(like_=f"{self.workflow_id} · "),
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])),
                )
            )
        mine = f"{self.workflow_id} · "
        return [r for r in runs if r.name.startswith(mine) and r.id not in self.dead]

    async def _consider(self, run: FlowRun) -> None:
        if self._hold_since is not None and run.created and run.created >= self._hold_since:
            self._hold_since = None
            self._held.put_nowait(run.id)
            return
        loop = asyncio.get_running_loop()
        first = self._seen.setdefault(run.id, loop.time())
        if loop.time() - first >= self.answer_after:
            await self._answer(run.id)

    async def _answer(self, run_id: UUID) -> None:
        """Resume the run with the answer. It may not take it yet (paused before its input's
        schema was saved) or any more (it ended): the next poll sees."""
        with contextlib.suppress(RuntimeError, PrefectException):
            await aresume_flow_run(run_id, run_input={"approved": self.approved})
            self.answered.append(run_id)
