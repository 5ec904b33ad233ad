"""The repository's Python files, as git lists them (tracked, or new and not ignored)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_files() -> list[str]:
    """Every Python file of the working tree, relative to the root, that exists now."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [f for f in listed if (ROOT / f).exists()]
