"""Prefect tasks: each one durable unit (a turn, a reconcile, an archive)."""

from prefect_coder.tasks.lifecycle import archive_chat
from prefect_coder.tasks.turns import reconcile_chat, run_turn

__all__ = ["archive_chat", "reconcile_chat", "run_turn"]
