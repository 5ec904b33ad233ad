"""Every lab command the docs give runs as written from a fresh clone, tiny.

Each ``python -m tests.…`` command of the README, the guides and bench/README.md runs in a
``git clone`` of HEAD with the current venv's python, its options as written but for its sizes,
set tiny (tests/docs/lab_commands.py); it must exit 0 and print the line that says it ran at that
size. The benchmarks' commands: test_bench_commands.py and test_recovery_command.py; the fleet
lab's: test_fleet_commands.py.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.docs.lab_commands import (
    LAB_MODULE,
    TINY,
    doc_commands,
    run_tiny,
    shared_api,
    tiny,
    tiny_params,
)

CAMPAIGN = re.compile(r"tests\.campaign")


def test_the_docs_name_lab_commands() -> None:
    modules = {words[2] for words in doc_commands()}
    assert {"tests.campaign", "tests.fleet", "bench.durable_step"} <= modules
    assert all(LAB_MODULE.fullmatch(module) for module in modules), modules


def test_every_command_has_a_tiny_recipe() -> None:
    assert {words[2] for words in doc_commands()} <= set(TINY)


def test_a_tiny_run_keeps_the_options_as_written_but_the_sizes() -> None:
    def tiny_of(command: str) -> str:
        words = shlex.split(command)
        return " ".join(tiny(words, TINY[words[2]]))

    assert tiny_of("python -m bench.durable_step --steps 200 --dsn …") == (
        "-m bench.durable_step --steps 1 --chunk 1"
    )
    assert tiny_of("python -m tests.campaign --count 20 --seed 7 --variant refund") == (
        "-m tests.campaign --count 1 --seed 7 --variant refund"
    )
    assert tiny_of("python -m tests.campaign --seed 31337 --only 417") == (
        "-m tests.campaign --seed 31337 --only 417"
    )


@pytest.mark.parametrize("argv", tiny_params(CAMPAIGN))
def test_campaign_command_runs_tiny(
    argv: list[str], clone: Path, request: pytest.FixtureRequest
) -> None:
    run_tiny(argv, clone, shared_api(argv, CAMPAIGN, request))
