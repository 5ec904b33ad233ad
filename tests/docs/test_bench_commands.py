"""Every benchmark command of bench/README.md (and the guides) runs as written from a fresh clone,
at a tiny size (see tests/docs/lab_commands.py): it exits 0 and prints its last table's line.
The recovery benchmarks run in files of their own, each a minute or more: bench.recovery in
test_recovery_command.py, bench.host_recovery (in the fleet lab) in test_fleet_commands.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.lab_commands import run_tiny, tiny_params

BENCH = re.compile(r"bench\.(?!host_recovery$|recovery$)\w+")


@pytest.mark.parametrize("argv", tiny_params(BENCH))
def test_bench_command_runs_tiny(argv: list[str], clone: Path) -> None:
    run_tiny(argv, clone)
