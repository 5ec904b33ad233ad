"""Every benchmark command of bench/README.md (and the guides) runs as written from a fresh clone,
at a tiny size (see tests/docs/lab_commands.py): it exits 0 and prints its last table's line.
bench.host_recovery runs in the fleet lab: test_fleet_commands.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.lab_commands import fresh_clone, run_tiny, tiny_commands

BENCH = re.compile(r"bench\.(?!host_recovery$)\w+")


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fresh_clone(tmp_path_factory.mktemp("clone"))


@pytest.mark.parametrize("argv", tiny_commands(BENCH), ids=" ".join)
def test_bench_command_runs_tiny(argv: list[str], clone: Path, tmp_path: Path) -> None:
    run_tiny(argv, clone, tmp_path)
