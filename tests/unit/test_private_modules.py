"""Nothing outside ``prefect_coder`` imports its private modules or names; nor do our flows,
which read as a user's flow would (on ``DurableChat``, ``DurableFleet``, ``SweepPass`` and
``prefect_coder.operations``).

Private: a module with a path part that starts with ``_`` (``prefect_coder._run``), or a
name that does. Tests, benchmarks and the labs use what a user of the package can: the
names of ``prefect_coder``, ``prefect_coder.settings``, ``.tasks``, ``.flows``,
``.blocks``, ``.operations`` and the core ``coder_chat``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from .repo_files import ROOT, python_files


def python_files_outside_the_package() -> list[Path]:
    return [ROOT / f for f in python_files() if not f.startswith("prefect_coder/")]


def our_flows() -> list[Path]:
    return [ROOT / f for f in python_files() if f.startswith("prefect_coder/flows/")]


def private_imports(source: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _private(alias.name):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _private(node.module):
                yield node.lineno, node.module
            elif node.module.split(".")[0] == "prefect_coder":
                for alias in node.names:
                    if alias.name.startswith("_"):
                        yield node.lineno, f"{node.module}.{alias.name}"


def _private(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "prefect_coder" and any(p.startswith("_") for p in parts[1:])


def test_the_detector_sees_private_imports() -> None:
    found = list(
        private_imports(
            "from prefect_coder._run.hold import Hold\n"
            "import prefect_coder._run.naming\n"
            "from prefect_coder.chat import _private\n"
            "from prefect_coder.settings import WorkflowSettings\n"
        )
    )
    assert [name for _, name in found] == [
        "prefect_coder._run.hold",
        "prefect_coder._run.naming",
        "prefect_coder.chat._private",
    ]


def test_no_module_outside_the_package_imports_a_private_one() -> None:
    files = python_files_outside_the_package()
    assert any(f.parts[-2] == "lab" for f in files)  # the tests are among them
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in files
        for line, name in private_imports(path.read_text())
    ]
    assert found == []


def test_our_flows_import_only_public_names() -> None:
    flows = our_flows()
    assert any(f.name == "durable_chats.py" for f in flows)
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in flows
        for line, name in private_imports(path.read_text())
    ]
    assert found == []
