"""Every lab and benchmark command the docs give names a module whose CLI starts from a fresh clone.

Each ``python -m tests.…`` / ``python -m bench.…`` the README, the guides and bench/README.md name
is run with ``--help`` in a ``git clone`` of HEAD (the current venv's python): the module is
shipped in the repository and its argument parser builds without anything the working tree
alone has. Not yet: running each with a tiny count (the fleet lab needs root and network
namespaces; a campaign schedule takes a Prefect API and several processes).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMMAND = re.compile(r"python -m ((?:tests|bench)\.[a-z_]+)")


def lab_modules() -> list[str]:
    return sorted({m for page in PAGES for m in COMMAND.findall(page.read_text())})


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    clone = tmp_path_factory.mktemp("clone") / "prefect-coder"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    return clone


def test_the_docs_name_lab_commands() -> None:
    assert {"tests.campaign", "tests.fleet", "bench.durable_step"} <= set(lab_modules())


@pytest.mark.parametrize("module", lab_modules())
def test_lab_command_starts_from_a_fresh_clone(module: str, fresh_clone: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=fresh_clone,
        capture_output=True,
        text=True,
        # --help answers at once; a command that ignored it would start a whole run.
        timeout=90,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.startswith("usage:"), ran.stdout
