"""The store fixtures of ``tests/durable`` (each test on SQLite and on Postgres), and the
command line run as a person runs it, its output captured."""

from __future__ import annotations

import asyncio

import pytest

from prefect_coder.cli import main
from tests.durable.backends import Backend
from tests.durable.store_fixtures import (  # noqa: F401 - fixtures, found here by pytest
    backend,
    backend_spec,
    pg,
    pg_spec,
    postgres_dsn,
)

from .support import Cli


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    async def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()  # what came before is not this command's
        # Its own thread: the command runs its own event loop (asyncio.run), as in a shell.
        code = await asyncio.to_thread(main, list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def store_args(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> list[str]:  # noqa: F811
    """The options that pick ``backend``'s store: a file, or Postgres by its DSN in the
    environment (never on the command line)."""
    monkeypatch.delenv("CODER_ORG_ID", raising=False)
    if backend.is_postgres:
        monkeypatch.setenv("PREFECT_CODER_POSTGRES_DSN", backend.dsn)
        return ["--postgres", "--schema", backend.location]
    return ["--sqlite", backend.location]
