"""One Prefect test API per test session, started only by tests that need it (~13 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prefect.testing.utilities import prefect_test_harness


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    # No network here: telemetry would only log failures.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        with prefect_test_harness(server_startup_timeout=120):
            yield
