"""Test helpers live in support modules: no module under tests/ imports a test module or a
conftest (pytest finds fixtures itself; a conftest offers shared ones by importing them
from a support module), and the three labs (crash, campaign, fleet) share code only
through the lab core, tests/lab."""

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
    assert "tests.lab.children" in imported_modules(module)


LABS = ("crash", "campaign", "fleet")


def lab_of(module: str) -> str | None:
    """The lab a dotted module name belongs to (``tests.fleet.plan`` → ``fleet``), if any."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "tests" and parts[1] in LABS else None


def test_a_lab_shares_through_the_lab_core_only() -> None:
    """What two labs share lives in tests/lab: no lab imports another lab's modules."""
    offenders = [
        f"{path.relative_to(TESTS.parent)} imports {module}"
        for lab in LABS
        for path in sorted((TESTS / lab).rglob("*.py"))
        for module in imported_modules(path)
        if lab_of(module) not in (None, lab)
    ]
    assert offenders == []


def test_the_lab_rule_names_the_lab_of_a_module() -> None:
    assert lab_of("tests.fleet.plan") == "fleet"
    assert lab_of("tests.lab.steps") is None
    assert lab_of("tests.campaign") == "campaign"
    assert "tests.lab.children" in imported_modules(TESTS / "campaign" / "drive.py")
