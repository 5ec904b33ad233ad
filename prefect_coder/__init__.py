"""prefect-coder: durable Coder Agents chats, driven from Prefect.

The public API, importable from here::

    from prefect_coder import DurableChat, DurableFleet, TaskSettings, WorkflowSettings, durable_tool
    from prefect_coder import CoderCredentials, PostgresLedger, SqliteLedger

Names load on first use, so ``prefect-coder simulator`` starts without importing
Prefect.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coder_chat.durable import durable_tool
    from coder_chat.durable.records import PromptChanged
    from coder_chat.durable.step import StepResult
    from prefect_coder.blocks import CoderCredentials, PostgresLedger, SqliteLedger
    from prefect_coder.chat import (
        DurableChat,
        StoreLost,
        Structured,
        Superseded,
        WorkflowCancelled,
        WorkflowFinished,
    )
    from prefect_coder.fleet import DurableFleet, FleetFailed
    from prefect_coder.settings import TaskSettings, WorkflowSettings

_WHERE = {
    "durable_tool": "coder_chat.durable",
    "PromptChanged": "coder_chat.durable.records",
    "StepResult": "coder_chat.durable.step",
    "CoderCredentials": "prefect_coder.blocks",
    "PostgresLedger": "prefect_coder.blocks",
    "SqliteLedger": "prefect_coder.blocks",
    "DurableChat": "prefect_coder.chat",
    "StoreLost": "prefect_coder.chat",
    "Structured": "prefect_coder.chat",
    "Superseded": "prefect_coder.chat",
    "WorkflowCancelled": "prefect_coder.chat",
    "WorkflowFinished": "prefect_coder.chat",
    "DurableFleet": "prefect_coder.fleet",
    "FleetFailed": "prefect_coder.fleet",
    "TaskSettings": "prefect_coder.settings",
    "WorkflowSettings": "prefect_coder.settings",
}

__all__ = [
    "CoderCredentials",
    "DurableChat",
    "DurableFleet",
    "FleetFailed",
    "PostgresLedger",
    "PromptChanged",
    "SqliteLedger",
    "StepResult",
    "StoreLost",
    "Structured",
    "Superseded",
    "TaskSettings",
    "WorkflowCancelled",
    "WorkflowFinished",
    "WorkflowSettings",
    "durable_tool",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'prefect_coder' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
