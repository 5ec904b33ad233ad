"""Test helpers live in support modules: no module under tests/ imports a test module or a
conftest (pytest finds fixtures itself; a conftest offers shared ones by importing them
from a support module)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> list[str]:
    """The dotted names of the modules ``path`` imports from (relative ones resolved)."""
    package = ".".join(path.relative_to(TESTS.parent).parent.parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)]
            prefix = ".".join(base) + "." if node.level else ""
            found.append(prefix + (node.module or ""))
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


def test_no_module_imports_a_test_module_or_a_conftest() -> None:
    offenders = [
        f"{path.relative_to(TESTS.parent)} imports {module}"
        for path in sorted(TESTS.rglob("*.py"))
        for module in imported_modules(path)
        if module.startswith("tests.")
        and (module.rsplit(".", 1)[-1].startswith("test_") or module.endswith(".conftest"))
    ]
    assert offenders == []


def test_the_check_sees_relative_and_absolute_imports() -> None:
    module = TESTS / "crash" / "test_crash_points.py"
    assert "tests.crash.story" in imported_modules(module)
    assert "tests.crash.lab" in imported_modules(module)
