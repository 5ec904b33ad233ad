"""A Prefect test API that starts in seconds: Prefect's ``prefect_test_harness`` (a server in
a subprocess, on a SQLite file of its own), but its file is a copy of one Prefect's migrations
already ran on. Migrating a fresh file was most of each start (two thirds of its wall time, a
third of its CPU), paid by every xdist worker's session and every campaign.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import prefect
from prefect.context import _temporary_global_settings_context, get_settings_context
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_SERVER_DATABASE_CONNECTION_URL,
    temporary_settings,
)
from prefect.settings.legacy import Setting
from prefect.utilities.asyncutils import run_coro_as_sync

from tests.pgcluster import locked
from tests.ports import free_port

STARTUP_TIMEOUT = 120
#: How long the log lines and events a process still holds may take to reach its API before
#: they are left.
DRAIN_SECONDS = 30.0


@contextlib.contextmanager
def prefect_test_api(startup_timeout: int = STARTUP_TIMEOUT) -> Iterator[str]:
    """What ``prefect_test_harness`` does, on a copy of :func:`migrated_sqlite`; yields the
    API's URL, which Prefect's settings name while it runs."""
    with tempfile.TemporaryDirectory(prefix="prefect-coder-api-") as folder:
        database = Path(folder) / "prefect.db"
        shutil.copyfile(migrated_sqlite(), database)
        url = f"sqlite+aiosqlite:///{database}"
        with temporary_settings(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: url}):
            server = SubprocessASGIServer(port=free_port())
            # Prefect code that would start an ephemeral server finds this one instead.
            prior = SubprocessASGIServer._instances.get(None)
            SubprocessASGIServer._instances[None] = server
            try:
                server.start(timeout=startup_timeout)
                with (
                    temporary_settings(updates={PREFECT_API_URL: server.api_url}),
                    # Seen by contexts copied before it started, as the harness makes it.
                    _temporary_global_settings_context(get_settings_context()),
                ):
                    yield server.api_url
                    run_coro_as_sync(_drain_workers())  # its logs and events, before it stops
            finally:
                server.stop()
                SubprocessASGIServer._instances.pop(None, None)
                if prior is not None:
                    SubprocessASGIServer._instances[None] = prior


@contextlib.asynccontextmanager
async def api_settings(updates: Mapping[Setting, Any]) -> AsyncIterator[None]:
    """Prefect's settings as ``updates`` say (a test's own server's API, say) for a while,
    with this process's log and events workers drained on the way in and on the way out.

    Prefect keeps one events worker per process whatever API it was made for (its key holds
    no URL), and one log worker: made while the settings named a test's own server, they go
    on sending every later event and line of the process there, to a server gone by then.
    Each event then failed after a second and a half, and a later test's flow run in the
    same xdist worker waited minutes on them, past its time limit.
    """
    await _drain_workers()
    with temporary_settings(updates=updates):
        try:
            yield
        finally:
            await _drain_workers()


async def _drain_workers() -> None:
    """Send what this process still holds for the API (as the harness does on its way out).

    Only workers that exist are drained. Asked for by name, a log worker would be started
    for it, and with no API set its start spawns a Prefect server of its own: a test that
    points Prefect at its stack from a process with no API did, and each clean-clone CI run
    was left one of those servers running.
    """
    for drained in (
        APILogWorker.drain_all(timeout=DRAIN_SECONDS, at_exit=False),
        EventsWorker.drain_all(timeout=DRAIN_SECONDS),
    ):
        if inspect.isawaitable(drained):
            await drained


def migrated_sqlite() -> Path:
    """A SQLite file Prefect's migrations (this environment's Prefect) ran on. Made once per
    temporary folder and Prefect version, under a lock, so that a session's workers share
    it; CI's temporary folder goes at the end of the run, elsewhere it stays as a cache."""
    home = Path(tempfile.gettempdir()) / f"prefect-coder-sqlite-prefect-{prefect.__version__}"
    database = home / "prefect.db"
    with locked(home.with_suffix(".lock")):
        if not (home / "ready").exists():
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir()
            _migrate(database, home)
            (home / "ready").touch()
    return database


def _migrate(database: Path, home: Path) -> None:
    """``prefect server database upgrade`` on ``database``; then everything in the file itself
    (Prefect's SQLite runs in WAL mode), so that a copy of the file alone is the database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{database}",
    )
    prefect_cli = Path(sys.executable).parent / "prefect"
    command = [str(prefect_cli), "server", "database", "upgrade", "-y"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"Prefect's migrations failed: {done.stderr[-2000:]}")
    with contextlib.closing(sqlite3.connect(database)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
