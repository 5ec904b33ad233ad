"""No function is over 60 lines (decorators and docstring included), outside the
benchmarks and the simulator: a longer one does several things, each worth a name."""

from __future__ import annotations

import ast

from .repo_files import ROOT, python_files

LIMIT = 60
EXEMPT = ("bench/", "coder_chat/simulator/")


def long_functions(source: str) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - start + 1
            if length > LIMIT:
                found.append((node.name, length))
    return found


def test_the_count_takes_decorators_and_docstrings_in() -> None:
    body = "\n".join(f"    x = {i}" for i in range(58))
    assert long_functions(f'@flow\ndef f():\n    """Doc."""\n{body}\n') == [("f", 61)]
    assert long_functions(f"def f():\n{body}\n") == []


def test_no_function_is_over_sixty_lines() -> None:
    files = [f for f in python_files() if not f.startswith(EXEMPT)]
    assert len(files) > 100
    found = [
        f"{path}: {name} ({length} lines)"
        for path in files
        for name, length in long_functions((ROOT / path).read_text())
    ]
    assert found == []
