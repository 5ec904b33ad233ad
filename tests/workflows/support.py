"""What the workflows tests share beside their fixtures."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

#: ``prefect-coder ARGS…`` → (exit code, stdout, stderr): the ``cli`` fixture.
Cli = Callable[..., Awaitable[tuple[int, str, str]]]
