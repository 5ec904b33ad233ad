"""The test suite's own helper for pointing Prefect at another API for a while
(``tests.prefect_test_api.api_settings``): what this process emits afterwards reaches
the session's test API, not the server it pointed at (gone by then)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from prefect.client.orchestration import get_client
from prefect.events import emit_event
from prefect.events.worker import EventsWorker
from prefect.settings import PREFECT_API_URL

from tests.ports import free_port
from tests.prefect_test_api import api_settings

pytestmark = pytest.mark.usefixtures("prefect_api")


async def received(name: str, resource_id: str) -> int:
    body = {"filter": {"event": {"name": [name]}, "resource": {"id": [resource_id]}}, "limit": 5}
    async with get_client() as client:
        response = await client.request("POST", "/events/filter", json=body)
    return len(response.json()["events"])


async def test_an_event_after_another_api_reaches_the_test_api() -> None:
    gone = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    async with api_settings({PREFECT_API_URL: gone}):
        # Made here, Prefect's one events worker of the process would send to ``gone``.
        emit_event("prefect-coder.test.elsewhere", {"prefect.resource.id": "test.elsewhere"})
    resource = f"test.here.{uuid.uuid4().hex}"
    emit_event("prefect-coder.test.here", {"prefect.resource.id": resource})
    await EventsWorker.drain_all(timeout=30)  # type: ignore[misc]
    for _ in range(120):  # the server writes the events it takes in a moment later
        if await received("prefect-coder.test.here", resource):
            break
        await asyncio.sleep(0.5)
    assert await received("prefect-coder.test.here", resource) == 1
