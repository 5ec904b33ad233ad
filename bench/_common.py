"""What the Prefect benchmarks share: a Prefect API of their own, the simulator's request
count read through its admin routes, percentiles and the load average."""

from __future__ import annotations

import os
import statistics
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx

from bench._simproc import SimProcess


@contextmanager
def prefect_api() -> Iterator[Path]:
    """Prefect's test API (a temporary server in a subprocess, its own database: a copy of a
    migrated one, see tests/prefect_test_api.py), with results persisted under a temporary
    directory; yields that directory.

    Analytics are off (no network here). Logging is Prefect's default, as a worker
    has it: run logs at INFO go to the API and to the console (stderr).
    """
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    from tests.prefect_test_api import prefect_test_api

    with tempfile.TemporaryDirectory(prefix="prefect-coder-bench-") as tmp:
        results = Path(tmp) / "results"
        with (
            temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: results}),
            prefect_test_api(startup_timeout=180),
        ):
            yield Path(tmp)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"


def request_counts(sim: SimProcess) -> Counter[str]:
    """How many chat API requests the simulator has served, by route (admin routes not
    counted)."""
    response = httpx.get(
        f"{sim.base_url}/simulator/v1/records/request-counts", headers=sim.headers, timeout=30
    )
    response.raise_for_status()
    counts: dict[str, int] = response.json()
    return Counter(counts)


def requests_served(sim: SimProcess) -> int:
    """How many chat API requests the simulator has served (admin routes not counted)."""
    return sum(request_counts(sim).values())


def clear_requests(sim: SimProcess) -> None:
    httpx.delete(
        f"{sim.base_url}/simulator/v1/records/requests", headers=sim.headers, timeout=30
    ).raise_for_status()


@dataclass(frozen=True)
class Latency:
    p50_ms: float
    p99_ms: float
    mean_ms: float


def latency(samples: list[float]) -> Latency:
    """p50 (median) and p99 (nearest rank) of ``samples`` in seconds, in milliseconds."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return Latency(statistics.median(ordered) * 1000, p99 * 1000, statistics.fmean(ordered) * 1000)


async def postgres_reachable(dsn: str) -> str | None:
    """``None`` when a connection to ``dsn`` opens, else why not."""
    try:
        conn = await asyncpg.connect(dsn, timeout=10)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
    await conn.close()
    return None


async def drop_schema(dsn: str, schema: str) -> None:
    """Drop a throwaway schema a benchmark's Postgres store made (nothing if unreachable)."""
    try:
        conn = await asyncpg.connect(dsn)
    except (OSError, asyncpg.PostgresError):
        return
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()
