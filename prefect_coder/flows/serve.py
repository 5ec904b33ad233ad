"""Serve the three deployments from one process, for setups without a worker.

    python -m prefect_coder.flows.serve

It registers ``durable-chat``, ``durable-chats``, ``orphan-sweep`` (every 5
minutes) and ``archive-workflow`` with the Prefect API and runs their flow runs in
subprocesses until stopped; stopping it pauses the sweep's schedule.
"""

from __future__ import annotations

import asyncio

from prefect import aserve
from prefect.schedules import Cron

from prefect_coder.flows.archive_workflow import archive_workflow
from prefect_coder.flows.durable_chat import durable_chat
from prefect_coder.flows.durable_chats import durable_chats
from prefect_coder.flows.orphan_sweep import orphan_sweep


async def serve_all() -> None:
    await aserve(
        await durable_chat.ato_deployment(name="durable-chat", tags=["prefect-coder"]),
        await durable_chats.ato_deployment(name="durable-chats", tags=["prefect-coder"]),
        await orphan_sweep.ato_deployment(
            name="orphan-sweep",
            tags=["prefect-coder"],
            parameters={"target_deployment": "durable-chat"},
            schedule=Cron("*/5 * * * *", timezone="UTC"),
        ),
        await archive_workflow.ato_deployment(name="archive-workflow", tags=["prefect-coder"]),
    )


if __name__ == "__main__":
    asyncio.run(serve_all())
