"""The architecture page's layers table (docs/architecture.md) names every built-in task and flow there is."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

from prefect import Flow, Task

import prefect_coder.flows
import prefect_coder.tasks

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"


def _row(layer: str) -> str:
    return next(line for line in PAGE.read_text().splitlines() if line.startswith(layer))


def _defined(
    package: ModuleType, kind: type[Task[..., object]] | type[Flow[..., object]]
) -> set[str]:
    names = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, kind) and value.fn.__module__ == module.__name__:
                names.add(value.fn.__name__)
    return names


def test_the_tasks_row_names_every_task() -> None:
    row, tasks = _row("| `prefect_coder/tasks/`"), _defined(prefect_coder.tasks, Task)
    assert {"run_turn", "relaunch_workflow"} <= tasks
    assert [t for t in sorted(tasks) if f"`{t}`" not in row] == []


def test_the_flows_row_names_every_flow() -> None:
    row, flows = _row("| `prefect_coder/flows/`"), _defined(prefect_coder.flows, Flow)
    assert {"durable_chat", "orphan_sweep"} <= flows
    assert [f for f in sorted(flows) if f"`{f}`" not in row] == []


def test_every_module_of_tasks_defines_a_task() -> None:
    """``prefect_coder/tasks/`` holds tasks only: the run machinery lives in ``_run``."""
    package = prefect_coder.tasks
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        defined = [
            v
            for v in vars(module).values()
            if isinstance(v, Task) and v.fn.__module__ == module.__name__
        ]
        assert defined, f"{module.__name__} defines no task: it belongs in prefect_coder/_run"


def test_the_private_row_names_every_module_of_the_run_machinery() -> None:
    row = _row("| `prefect_coder/_run/`")
    modules = [
        p.stem for p in (ROOT / "prefect_coder" / "_run").glob("*.py") if p.stem != "__init__"
    ]
    assert "hold" in modules
    assert [m for m in modules if f"`{m}`" not in row] == []
