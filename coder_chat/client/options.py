"""``ChatOptions``: everything a turn needs to know about its chat, in one object.

A session takes it whole and hands it to each turn unchanged; the durable layer
holds the same object in :class:`~coder_chat.durable.context.DurableOptions`, so
the workflow's facts reach Coder in two shapes only: these options, then the
request body. It is frozen and checked once, when it is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..errors import CoderConfigError


@dataclass(frozen=True)
class ChatOptions:
    """How a chat is made and how its turns run; defaults follow the reference SDK."""

    #: Labels the chat is created with (the sweep finds a workflow's chats by them).
    labels: Mapping[str, str] = field(default_factory=dict)
    system_prompt: str | None = None
    #: A model config id, ``provider:model`` or display name (``None``: Coder's default),
    #: resolved to a config id on a session's first turn.
    model: str | None = None
    workspace_id: str | None = None
    mcp_server_ids: tuple[str, ...] = ()
    #: Bounds each segment of a turn (REST, stream and redial backoff together), seconds.
    request_timeout: float = 300.0
    #: The first pause before redialling a lost stream, and how many failed dials end it.
    redial_initial: float = 1.0
    redial_max_failures: int = 5
    #: How long a lost event may take to arrive before the turn acts without it.
    action_grace: float = 2.0
    #: Bounds an interrupt sent to stop a run.
    interrupt_timeout: float = 15.0
    #: Archiving retries its 409 every ``archive_retry_interval`` for ``archive_window``.
    archive_retry_interval: float = 1.0
    archive_window: float = 15.0

    def __post_init__(self) -> None:
        if self.request_timeout <= 0:
            raise CoderConfigError("request_timeout must be positive")
        timers = ("redial_initial", "action_grace", "interrupt_timeout", "archive_retry_interval")
        for name in (*timers, "archive_window"):
            if getattr(self, name) < 0:
                raise CoderConfigError(f"{name} must not be negative")
        if self.redial_max_failures < 1:
            raise CoderConfigError("redial_max_failures must be at least 1")
        # Frozen, so held as given; a list or dict handed in is copied once, here.
        object.__setattr__(self, "labels", dict(self.labels))
        object.__setattr__(self, "mcp_server_ids", tuple(self.mcp_server_ids))

    def labelled(self, labels: Mapping[str, str]) -> ChatOptions:
        """These options with ``labels`` added (a step's own labels on the workflow's)."""
        return replace(self, labels={**self.labels, **labels})
