"""The simulator tests' own fixtures."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from coder_chat.simulator import Simulator, serve_simulator
from tests.sim_timings import fast_config


@pytest.fixture
async def slow_sim() -> AsyncIterator[Simulator]:
    """A simulator whose deltas trickle (10 ms apart), for mid-stream moments."""
    async with serve_simulator(fast_config(delta_interval=0.01)) as simulator:
        yield simulator
