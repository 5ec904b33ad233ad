"""Shared fixtures: a fresh simulator per test, on real loopback sockets."""

from __future__ import annotations

import atexit
import compileall
import os
import shutil
import tempfile

# Prefect keeps results (our step cache) under PREFECT_HOME: give each test session
# its own, so no run ever reads another session's cached steps; gone when it ends.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="prefect-coder-tests-")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from coder_chat.simulator import Simulator, serve_simulator
from tests.rewritten import write_rewritten_tests
from tests.sim_timings import fast_config

atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    """Compile the project's packages (and the labs', which children import) once, before
    any test starts a process.

    Under ``PYTHONDONTWRITEBYTECODE`` (set on the machines we run on) no process writes
    the bytecode it compiles, so each of the hundreds of servers, workers, flow runs and
    CLI calls the tests start compiled the package from source again (half a second of
    CPU each); written here, they all read it. The same bytecode Python would write
    itself, and ignored once a source file changes (its timestamp no longer matches).
    """
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # once, not in every worker
        root = Path(__file__).resolve().parents[1]
        for package in ("prefect_coder", "coder_chat", "tests"):  # the labs run tests.*
            compileall.compile_dir(root / package, quiet=1)
        write_rewritten_tests(config, root / "tests")  # what pytest itself imports of tests/


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with serve_simulator(fast_config()) as simulator:
        yield simulator


@pytest.fixture
def coder_env(sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The simulator's ``CODER_*`` variables and a fresh embedded store, as a worker has them;
    yields the store's file."""
    for name, value in sim.env().items():
        monkeypatch.setenv(name, value)
    db = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("PREFECT_CODER_SQLITE_PATH", str(db))
    yield db


pytest_plugins = ["tests.prefect_harness"]


# The files whose tests take a minute or more, started first: on several processes
# (pyproject's addopts), a long file handed out last would run alone at the end. The
# addopts keep this order (--no-loadscope-reorder): xdist's own, by tests per file,
# handed these one-test files out last, and the suite ran 3 minutes longer.
_LONG_FIRST = (
    "tests/fleet/test_fleet.py",
    "tests/campaign/test_campaign.py",
    "tests/integration/test_readme_fleet.py",
    "tests/docs/test_fleet_commands.py",
    "tests/docs/test_recovery_command.py",
    "tests/docs/test_bench_commands.py",
    "tests/integration/test_redeployed_under_workflows.py",
    "tests/integration/test_deployments.py",
    "tests/integration/test_ui_story.py",
    "tests/integration/test_readme_setup.py",
    "tests/integration/test_ui_cancel.py",
    "tests/integration/test_installed_package.py",
    "tests/docs/test_lab_commands.py",
    "tests/integration/test_ui.py",
    "tests/integration/test_suspend.py",
    "tests/test_demo.py",
    "tests/crash/",
)


def _start_rank(item: pytest.Item) -> int:
    for rank, prefix in enumerate(_LONG_FIRST):
        if item.nodeid.startswith(prefix):
            return rank
    return len(_LONG_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_start_rank)
