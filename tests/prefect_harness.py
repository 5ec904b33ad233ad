"""One Prefect test API per test session, started only by tests that need it (seconds: see
:mod:`tests.prefect_test_api`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.prefect_test_api import prefect_test_api


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    # No network here: telemetry would only log failures.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        with prefect_test_api():
            yield
