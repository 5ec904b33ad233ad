"""Every fenced block of the README and the docs is covered by a test, and the checked ones pass.

A block is covered when the line before its fence is a marker a test reads:
``<!-- setup: N -->`` / ``<!-- fleet: N -->`` (pasted by tests/integration/test_readme_*.py),
``<!-- example: path -->`` (tests/unit/test_readme_example.py), ``<!-- own-project: ... -->``
(tests/unit/test_readme_own_project.py), ``<!-- check: demo -->`` (tests/test_demo.py runs it), or
``<!-- check: KIND -->`` checked here: ``imports`` (python: compiles, and every name it imports exists), ``cli``
(every ``prefect-coder`` line parses with our own CLI), ``lab`` (every ``python -m`` module exists).
Output-only blocks (```text) are exempt: they show what a command printed.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from prefect_coder.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(
    r"(?:<!-- (?P<tag>[a-z-]+):(?P<arg>[^>]*)-->\n)?```(?P<lang>\w*)\n(?P<body>.*?)\n```", re.S
)
TEST_MARKERS = {"setup", "fleet", "example", "own-project"}
CHECKS = {"imports", "cli", "lab", "demo"}


@dataclass(frozen=True)
class Block:
    page: str
    tag: str | None
    kind: str
    lang: str
    body: str


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        for m in FENCE.finditer(page.read_text()):
            kind = m["arg"].strip().split(" ")[0] if m["tag"] == "check" else ""
            found.append(Block(str(page.relative_to(ROOT)), m["tag"], kind, m["lang"], m["body"]))
    return found


def of_kind(kind: str) -> list[Block]:
    return [b for b in blocks() if b.tag == "check" and b.kind == kind]


def commands(body: str, prefix: str) -> list[list[str]]:
    """The block's command lines starting with ``prefix``, continuations joined, comments cut."""
    joined = body.replace("\\\n", " ")
    return [
        shlex.split(line, comments=True)
        for line in joined.splitlines()
        if line.strip().startswith(prefix)
    ]


def test_every_block_is_covered() -> None:
    for block in blocks():
        if block.lang == "text" and block.tag is None:
            continue  # output only
        assert block.lang, f"{block.page}: a fence with no language: {block.body[:60]!r}"
        assert block.tag in TEST_MARKERS or (block.tag == "check" and block.kind in CHECKS), (
            f"{block.page}: a block no test covers: {block.body[:60]!r}"
        )


@pytest.mark.parametrize("block", of_kind("cli"), ids=lambda b: b.page)
def test_cli_lines_parse(block: Block) -> None:
    lines = commands(block.body, "prefect-coder ")
    for argv in lines:
        # --help at the end: argparse checks the subcommands on the way, then prints and exits 0.
        with pytest.raises(SystemExit) as exited, contextlib.redirect_stdout(io.StringIO()):
            main([*argv[1:], "--help"])
        assert exited.value.code == 0, argv


@pytest.mark.parametrize("block", of_kind("lab"), ids=lambda b: b.page)
def test_lab_modules_exist(block: Block) -> None:
    lines = commands(block.body, "python -m ")
    assert lines, block.body
    for argv in lines:
        assert importlib.util.find_spec(argv[2]) is not None, argv


def test_python_blocks_compile_and_import() -> None:
    """The guides' python blocks are fragments (names from the prose around them): each compiles
    (top-level ``await`` allowed) and every name it imports from our packages exists."""
    python = of_kind("imports")
    assert python
    for block in python:
        tree = ast.parse(block.body)
        compile(block.body, block.page, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), (block.page, node.module, alias.name)
