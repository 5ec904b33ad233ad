"""The durable layer: Coder chats that outlive the process running them (no Prefect here).

What a user imports::

    from coder_chat.durable import durable_tool, SqliteStore, run_step, StepContext

``PostgresStore`` is imported on first use, so asyncpg loads only when it is needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .context import DurableOptions, StepContext, StepTools
from .reconcile import PauseAnswer, answer_pause
from .records import Fence, LedgerEntry, StepRecord, StepView, WorkflowRecord, WorkflowState
from .retire import Retired, retire_chat
from .sqlite import SqliteStore
from .step import StepResult, StepSpec, run_step
from .store import DurableStore, FencedOut
from .sweep import SweepPolicy, SweepReport, sweep
from .tools import DurableTool, durable_tool

if TYPE_CHECKING:
    from .postgres import PostgresStore

__all__ = [
    "DurableOptions",
    "DurableStore",
    "DurableTool",
    "Fence",
    "FencedOut",
    "LedgerEntry",
    "PauseAnswer",
    "PostgresStore",
    "Retired",
    "SqliteStore",
    "StepContext",
    "StepRecord",
    "StepResult",
    "StepSpec",
    "StepTools",
    "StepView",
    "SweepPolicy",
    "SweepReport",
    "WorkflowRecord",
    "WorkflowState",
    "answer_pause",
    "durable_tool",
    "retire_chat",
    "run_step",
    "sweep",
]


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from .postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
