"""The lab fixture: a crash lab with the simulator, the payments fake and the shared API.

Offered by the conftests of the crash suite and the campaign (whose refund-order kill
tests run in the same lab).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import prefect.settings
import pytest

from coder_chat.simulator import Simulator
from prefect_coder.payments import serve_payments

from .children import CrashLab


@pytest.fixture
async def lab(sim: Simulator, tmp_path: Path, prefect_api: None) -> AsyncIterator[CrashLab]:
    api_url = prefect.settings.PREFECT_API_URL.value()
    assert api_url, "the Prefect test API is not running"
    # The server-side tool deadline never passes by itself here; a test that needs it
    # passes it explicitly (``sim.time_out_tools``).
    sim.config.tool_result_deadline = 600.0
    async with serve_payments() as (payments_url, payments):
        crash_lab = CrashLab(sim, payments_url, payments, tmp_path, str(api_url))
        try:
            yield crash_lab
        finally:
            await crash_lab.close()
            sim.faults.clear()
            payments.clear()
