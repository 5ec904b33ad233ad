"""bench.recovery, as bench/README.md gives it, runs from a fresh clone with one try of each kind
(see tests/docs/lab_commands.py): a real ``prefect server``, the shipped YAML deployed, a process
worker, then a flow-run process killed and a worker killed, each relaunched. About a minute and a
half even so, hence a file of its own, which xdist runs beside the other commands' files.

It is also the suite's proof of recovery by events from the shipped YAML: the command fails
unless the flow run killed alone was relaunched by the crash trigger's pass, the dead worker's
run by the pass its stopped pulse started (Prefect's heartbeat playing no part), each relaunch
finished, and no finished relaunch was taken for silent afterwards. (A pass told of a run that
pulsed since leaves it alive: tests/sweep/test_orphan_sweep_flow.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.lab_commands import run_tiny, tiny_params

RECOVERY = re.compile(r"bench\.recovery")


@pytest.mark.parametrize("argv", tiny_params(RECOVERY))
def test_recovery_command_runs_tiny(argv: list[str], clone: Path) -> None:
    run_tiny(argv, clone)
