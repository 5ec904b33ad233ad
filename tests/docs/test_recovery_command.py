"""bench.recovery, as bench/README.md gives it, runs from a fresh clone with one try of each kind
(see tests/docs/lab_commands.py): a real ``prefect server``, the shipped YAML deployed, a process
worker, then a flow-run process killed and a worker killed, each relaunched. About a minute and a
half even so, hence a file of its own, which xdist runs beside the other commands' files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.lab_commands import run_tiny, tiny_params

RECOVERY = re.compile(r"bench\.recovery")


@pytest.mark.parametrize("argv", tiny_params(RECOVERY))
def test_recovery_command_runs_tiny(argv: list[str], clone: Path) -> None:
    run_tiny(argv, clone)
