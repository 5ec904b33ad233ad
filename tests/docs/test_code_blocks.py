"""Every fenced block of the README and the docs is covered by a test, and the checked ones pass.

A block is covered when the line before its fence is a marker a test reads:
``<!-- setup: N -->`` / ``<!-- fleet: N -->`` (pasted by tests/integration/test_readme_*.py),
``<!-- example: path -->`` (tests/unit/test_readme_example.py), ``<!-- own-project: ... -->``
(tests/unit/test_readme_own_project.py), ``<!-- check: demo -->`` (tests/test_demo.py runs it),
``<!-- check: types -->`` and ``<!-- check: runs -->`` (python: type-checked, and run against the
simulator; tests/docs/test_python_blocks.py), or checked here: ``cli`` (every ``prefect-coder``
line parses with our own CLI; a ``prefect deployment run`` line names a shipped deployment and
parameters its flow takes) and ``lab`` (every ``python -m tests.…``/``bench.…`` line is one
that tests/docs/test_*_commands.py run; a ``python -m pytest`` line names paths and markers that
exist). Output-only blocks (```text) are exempt: they show what a command printed.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import json
import tomllib

import pytest
import yaml  # type: ignore[import-untyped]

from prefect_coder.cli import main
from tests.docs.blocks import ROOT, Block, blocks, commands, of_kind
from tests.docs.lab_commands import LAB_MODULE, doc_commands

TEST_MARKERS = {"setup", "fleet", "example", "own-project"}
CHECKS = {"types", "runs", "cli", "lab", "demo"}


def test_every_block_is_covered() -> None:
    for block in blocks():
        if block.lang == "text" and block.tag is None:
            continue  # output only
        assert block.lang, f"{block.name}: a fence with no language: {block.body[:60]!r}"
        assert block.tag in TEST_MARKERS or (block.tag == "check" and block.kind in CHECKS), (
            f"{block.name}: a block no test covers: {block.body[:60]!r}"
        )


@pytest.mark.parametrize("block", of_kind("cli"), ids=lambda b: b.name)
def test_cli_lines_parse(block: Block) -> None:
    lines = commands(block.body, "prefect")
    assert lines, block.body
    for argv in lines:
        if argv[0] == "prefect-coder":
            parses_with_our_cli(argv[1:])
        else:
            runs_a_shipped_deployment(argv)


def parses_with_our_cli(args: list[str]) -> None:
    # --help at the end: argparse checks the subcommands on the way, then prints and exits 0.
    with pytest.raises(SystemExit) as exited, contextlib.redirect_stdout(io.StringIO()):
        main([*args, "--help"])
    assert exited.value.code == 0, args


def runs_a_shipped_deployment(argv: list[str]) -> None:
    """``prefect deployment run 'FLOW/DEPLOYMENT' --param k=v …``: a deployment of
    deployments/prefect.yaml, of that flow, whose parameters the flow takes (JSON where given)."""
    assert argv[:3] == ["prefect", "deployment", "run"], argv
    flow_name, deployment = argv[3].split("/")
    shipped = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    [spec] = [d for d in shipped["deployments"] if d["name"] == deployment]
    module, _, name = spec["entrypoint"].partition(":")
    flow = getattr(importlib.import_module(module), name)
    assert flow.name == flow_name, (flow.name, argv)
    taken = inspect.signature(flow.fn).parameters
    for option, param in zip(argv[4::2], argv[5::2], strict=True):
        assert option == "--param", argv
        key, _, value = param.partition("=")
        assert key in taken, (key, list(taken))
        if value[:1] in "[{":
            json.loads(value)


@pytest.mark.parametrize("block", of_kind("lab"), ids=lambda b: b.name)
def test_lab_lines_are_run_or_select_tests(block: Block) -> None:
    lines = commands(block.body, "python -m ")
    assert lines, block.body
    for argv in lines:
        if LAB_MODULE.fullmatch(argv[2]):
            assert argv in doc_commands(), argv  # so tests/docs/test_*_commands.py run it
        else:
            assert argv[2] == "pytest", argv
            selects_tests(argv[3:])


def selects_tests(args: list[str]) -> None:
    """A pytest line of the docs names paths that exist and markers the project declares (the
    suite itself runs them: `python -m pytest` is .ci/run's test command)."""
    declared = {marker.split(":")[0] for marker in declared_markers()}
    words = iter(args)
    for word in words:
        if word == "-m":
            assert next(words) in declared, args
        else:
            assert (ROOT / word).exists(), args


def declared_markers() -> list[str]:
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())
    markers: list[str] = settings["tool"]["pytest"]["ini_options"]["markers"]
    return markers
