"""The fleet lab's commands the docs give (a fleet campaign, bench.host_recovery) run as written
from a fresh clone, at one schedule or one try (see tests/docs/lab_commands.py). They need root
and network namespaces, as the fleet scenario does (tests/fleet): without them they fail, saying
so, rather than skip. Each brings a fleet up: about a minute a command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.lab_commands import run_tiny, tiny_params

FLEET_LAB = re.compile(r"tests\.fleet|bench\.host_recovery")


@pytest.mark.parametrize("argv", tiny_params(FLEET_LAB))
def test_fleet_lab_command_runs_tiny(argv: list[str], clone: Path) -> None:
    run_tiny(argv, clone)
