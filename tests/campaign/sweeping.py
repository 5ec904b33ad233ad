"""The one sweep a schedule ends with, called in-process on the sweep core.

Kept in this one function because the core's signature is about to change: the
campaign calls it with the charge_card and issue_refund tools (so a ``committing``
effect can be re-driven), orphans of any age retired, and no workflow ever taken for stranded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

from coder_chat import ChatClient
from coder_chat.client.options import ChatOptions
from coder_chat.durable.context import DurableOptions, StepTools
from coder_chat.durable.store import DurableStore
from coder_chat.durable.sweep import SweepPolicy, SweepReport, sweep
from coder_chat.simulator import Simulator
from prefect_coder.demo_tools import charge_card
from prefect_coder.examples.refund import issue_refund

POLICY = SweepPolicy(
    orphan_age=0,
    stale_heartbeat=10**9,
    stuck_after=10**9,
    options=DurableOptions(
        chat=ChatOptions(interrupt_timeout=5, archive_retry_interval=0.05), poll_interval=0.05
    ),
)
#: The tools find their payments service in ``PAYMENTS_URL`` when it runs; schedules
#: running at once each have their own, so their sweeps take turns with the variable.
_PAYMENTS_ENV = asyncio.Lock()


async def sweep_once(
    sim: Simulator, store: DurableStore, payments_url: str, lines: list[str]
) -> SweepReport:
    """One sweep pass over the store's chats on ``sim``; its report lines go to ``lines``."""
    async with (
        payments_env(payments_url),
        ChatClient(base_url=sim.base_url, token=sim.token) as client,
    ):
        return await sweep(
            client,
            store,
            str(sim.organization_id),
            POLICY,
            tools=StepTools.build([charge_card, issue_refund]),
            report=lines.append,
        )


@contextlib.asynccontextmanager
async def payments_env(payments_url: str) -> AsyncIterator[None]:
    """``PAYMENTS_URL`` set to this schedule's payments service, while no other schedule's
    sweep or person uses the variable (the tools read it when they run, in this process)."""
    async with _PAYMENTS_ENV:
        previous = os.environ.get("PAYMENTS_URL")
        os.environ["PAYMENTS_URL"] = payments_url
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("PAYMENTS_URL", None)
            else:
                os.environ["PAYMENTS_URL"] = previous
