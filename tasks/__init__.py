"""Prefect tasks: each one durable unit (a turn, a reconcile, an archive)."""

from .lifecycle import archive_chat, reconcile_chat
from .turns import run_turn

__all__ = ["archive_chat", "reconcile_chat", "run_turn"]
