"""``ChatSession``: one Coder chat driven turn by turn, like the reference SDK's ``CoderAgent``.

A session holds a pointer to a chat (``chat_id`` and the resume cursor
``last_seen_message_id``), never the chat itself: all state lives on the server.
Construction does no I/O. The first ``generate()`` creates the chat; later ones
resume it, in this process or any other that was handed the pointer.

Each ``generate()`` runs one turn as one or more *segments* (submit, then read
the stream until the turn settles or pauses for client tools). The session's
:class:`~.options.ChatOptions` say how: ``request_timeout`` bounds every segment,
REST calls and redial backoff included; ``deadline`` bounds the whole call.

``ChatSession.connect(base_url, token, organization_id)`` makes a session with a
client of its own; ``ChatSession(client, organization_id)`` shares a client (many
sessions, one connection pool), which the session never closes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from pydantic import BaseModel

from ..errors import CoderApiError, CoderConfigError, CoderError
from ..protocol.models import Usage
from .events import TransportCallback
from .options import ChatOptions
from .rest import ChatClient
from .results import TurnResult
from .tools import ClientTool, ToolFunction, client_tool
from .turn import BeforeAction, BeforeInterrupt, StopOutcome, Turn, no_check, no_record

M = TypeVar("M", bound=BaseModel)


DEFAULT_OPTIONS = ChatOptions()


@dataclass(frozen=True)
class SessionHooks:
    """What a session calls back as its turns run (a durable step's fence and report)."""

    #: Awaited with an action's name before each request that acts on the chat.
    before_action: BeforeAction = no_check
    #: Where each turn's story is told as it happens (:class:`.story.TurnStory`).
    story: Callable[[str], None] | None = None
    #: Awaited before a turn's stop (its deadline, a timeout, a cancellation) interrupts
    #: the chat's run; raising sends no interrupt (a durable step journals the stop first).
    before_interrupt: BeforeInterrupt = no_record


NO_HOOKS = SessionHooks()


class ChatSession:
    """A durable pointer to one chat, and the machinery to run turns on it."""

    def __init__(
        self,
        client: ChatClient,
        organization_id: str,
        *,
        chat_id: str | None = None,
        last_seen_message_id: int | None = None,
        options: ChatOptions = DEFAULT_OPTIONS,
        tools: Sequence[ToolFunction | ClientTool] = (),
        hooks: SessionHooks = NO_HOOKS,
    ) -> None:
        _check_pointer(organization_id, chat_id, last_seen_message_id)
        self.client = client
        self.organization_id = organization_id
        self.chat_id = self.last_known_chat_id = chat_id
        self.last_seen_message_id = last_seen_message_id
        self.options = options
        self.tools = [client_tool(t) for t in tools]
        self.hooks = hooks
        #: The config id ``options.model`` names, once a turn resolved it.
        self.model_config_id: str | None = None
        #: Resolved once: a hint that names no config leaves Coder's default, unasked again.
        self.model_resolved = False
        # A client handed in is shared: the session uses it but never closes it.
        self._owns_client = False
        self._busy = False
        self._segments = 0
        #: What stopping the last turn's run came to, when it had to be stopped.
        self.last_stop: StopOutcome | None = None
        #: When that stop's interrupt was sent (this machine's clock), if it was.
        self.last_stop_at: datetime | None = None
        #: The usage of every assistant message the session's turns read in the chat's
        #: history past their cursor (their own, and anything else that ran there), by
        #: message id: what that stretch of the chat consumed, each message once.
        self.seen_usage: dict[int, Usage | None] = {}

    @classmethod
    def connect(
        cls,
        base_url: str,
        token: str,
        organization_id: str,
        *,
        options: ChatOptions = DEFAULT_OPTIONS,
        tools: Sequence[ToolFunction | ClientTool] = (),
        chat_id: str | None = None,
        last_seen_message_id: int | None = None,
        on_transport_event: TransportCallback | None = None,
        hooks: SessionHooks = NO_HOOKS,
    ) -> ChatSession:
        """A session with a client of its own (closed by :meth:`aclose`)."""
        # Checked before the client is made, so that a refused pointer leaves nothing open.
        _check_pointer(organization_id, chat_id, last_seen_message_id)
        client = ChatClient(base_url=base_url, token=token, on_transport_event=on_transport_event)
        session = cls(
            client,
            organization_id,
            chat_id=chat_id,
            last_seen_message_id=last_seen_message_id,
            options=options,
            tools=tools,
            hooks=hooks,
        )
        session._owns_client = True
        return session

    def __repr__(self) -> str:
        return f"ChatSession(chat_id={self.chat_id!r}, last_seen_message_id={self.last_seen_message_id!r})"

    # -- turns -----------------------------------------------------------------------
    async def generate(
        self,
        prompt: str,
        *,
        deadline: float | None = None,
        output_type: type[BaseModel] | None = None,
    ) -> TurnResult:
        """Run one turn to its end and return its result.

        Raises :class:`CoderChatError` when the turn ends in ``error`` or a segment
        times out (``kind="timeout"``), :class:`CoderStreamError` when the stream
        cannot be re-established, :class:`CoderApiError` for a rejected request,
        and the built-in ``TimeoutError`` when ``deadline`` expires. On a timeout,
        a deadline or cancellation, the server run is interrupted best-effort.
        """
        if self._busy:
            raise CoderError("this ChatSession is already running a turn; run turns one at a time")
        if not prompt.strip():
            raise CoderConfigError("prompt must not be empty")
        self._busy = True
        self.last_stop = self.last_stop_at = None
        turn = Turn(self, prompt, output_type)
        try:
            if deadline is None:
                return await turn.run()
            async with asyncio.timeout(deadline):
                return await turn.run()
        except (TimeoutError, asyncio.CancelledError):
            await asyncio.shield(turn.stop_server())
            raise
        finally:
            self._busy = False

    def next_segment(self) -> int:
        self._segments += 1
        return self._segments

    # -- lifecycle ---------------------------------------------------------------------
    async def interrupt(self) -> None:
        """Ask the server to stop the chat's run. A 409 (nothing running) is raised."""
        target = self.chat_id or self.last_known_chat_id
        if target is None:
            return
        await self.hooks.before_action("interrupt")
        await self.client.interrupt_chat(target)

    async def _interrupt_quietly(self) -> None:
        with contextlib.suppress(CoderError, TimeoutError):
            async with asyncio.timeout(self.options.interrupt_timeout):
                await self.interrupt()

    async def archive(self) -> None:
        """Archive the chat, retrying its 409 while a run winds down; archived already is done.

        The session keeps its ``chat_id``. An archived chat cannot be resumed, so a
        durable workflow archives once, at its end, never per step.
        """
        target = self.chat_id or self.last_known_chat_id
        if target is None:
            return
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.options.archive_window
        while True:
            # Before every attempt, not once: a run that lost its epoch while the chat wound
            # down must not archive it on a retry (the CI fleet scenario saw one land 0.0 s
            # after the takeover).
            await self.hooks.before_action("archive")
            try:
                await self.client.archive_chat(target)
                return
            except CoderApiError as exc:
                if exc.status == 400 and "already archived" in exc.message:
                    return
                if exc.status != 409 or loop.time() >= give_up:
                    raise
            await asyncio.sleep(self.options.archive_retry_interval)

    async def aclose(self) -> None:
        """Release the HTTP connections (the chat itself is left as it is)."""
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> ChatSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Interrupt and archive the chat, then close.

        Convenient for one-off scripts, and wrong for durable steps: archiving ends
        resumability, so a workflow must not use ``async with`` per step.
        """
        try:
            await self._interrupt_quietly()
            with contextlib.suppress(CoderError, TimeoutError):
                await self.archive()
        finally:
            await self.aclose()


def _check_pointer(organization_id: str, chat_id: str | None, cursor: int | None) -> None:
    """The chat a session points at: an organization, and a cursor only with its chat."""
    if not organization_id:
        raise CoderConfigError("organization_id is required")
    if cursor is None:
        return
    if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 1:
        raise CoderConfigError("last_seen_message_id must be a positive integer")
    if chat_id is None:
        raise CoderConfigError("last_seen_message_id needs the chat_id it belongs to")
