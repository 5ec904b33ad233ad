"""One turn of a :class:`ChatSession`, segment by segment.

Segment 1 submits the prompt (creating the chat on the first turn); each later
segment submits client-tool results. Every segment then reads the chat's stream
until the turn settles (``stop``/``error``) or pauses for client tools
(``tool-calls``). One stream serves the whole turn, so a pause keeps its socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from ..errors import (
    CoderApiError,
    CoderChatError,
    CoderError,
    CoderStoreError,
    CoderStreamError,
    CoderToolError,
    CoderTransportError,
)
from ..protocol.models import ChatErrorInfo, MessageEvent, ToolCallRequest
from ..protocol.models_hint import resolve_model_hint
from ..protocol.transcript import pending_calls, structured_output, to_transcript
from ..protocol.translator import TurnTranslator
from .events import Emitter, SegmentSettle, SegmentStart, TransportEvent, WsOpen, WsRedial
from .options import ChatOptions
from .results import TurnResult, build_steps, turn_text
from .story import TurnStory
from .stream import ChatStream
from .tools import (
    ClientTool,
    ToolArgumentsError,
    ToolCallContext,
    ToolFailed,
    structured_output_tool,
    tool_output,
)

if TYPE_CHECKING:
    from .rest import ChatClient
    from .session import ChatSession


#: What stopping a turn's run came to: its run ``interrupted`` (cut short), its queued
#: prompt ``withdrawn``, nothing running (``idle``: the run had ended by itself), the
#: interrupt ``undelivered`` (no connection), or ``unknown``.
StopOutcome = Literal["interrupted", "withdrawn", "idle", "undelivered", "unknown"]

#: Called with an action's name (``create``, ``send``, ``tool-results``, ``interrupt``,
#: ``archive``) before the request that performs it; raising stops the action.
BeforeAction = Callable[[str], Awaitable[None]]

#: Awaited with the chat and the moment (this machine's clock) just before a turn's stop
#: sends its interrupt; raising sends none, so a caller can refuse a stop it cannot record.
BeforeInterrupt = Callable[[str, datetime], Awaitable[None]]


async def no_check(action: str) -> None:
    """The hook of a session that checks nothing before it acts."""
    return


async def no_record(chat_id: str, at: datetime) -> None:
    """The hook of a session that records nothing before it interrupts."""
    return


class Turn:
    def __init__(
        self, session: ChatSession, prompt: str, output_type: type[BaseModel] | None
    ) -> None:
        self.session = session
        self.client: ChatClient = session.client
        self.options: ChatOptions = session.options
        self.before_action: BeforeAction = session.hooks.before_action
        self.before_interrupt: BeforeInterrupt = session.hooks.before_interrupt
        self.prompt = prompt
        self.output_type = output_type
        self.tools: dict[str, ClientTool] = {t.name: t for t in session.tools}
        if output_type is not None:
            self.tools["structured_output"] = structured_output_tool(output_type)
        self.translator = TurnTranslator(client_tools=frozenset(self.tools))
        tell = session.hooks.story
        self.story = None if tell is None else TurnStory(tell, client_tools=frozenset(self.tools))
        self.stream: ChatStream | None = None
        self._redialled = False
        self.created_chat = False
        self.queued_id: int | None = None
        #: A send was made and its answer has not come (yet): where the prompt went is
        #: unknown until the chat is read.
        self.send_unanswered = False
        #: Until the prompt's send (or the chat's creation) leaves, nothing of this turn
        #: runs in the chat: a stop then has nothing to stop.
        self.prompt_unsent = True
        #: The newest message id before the send: a prompt admitted by it comes after.
        self.sent_after = 0
        self.structured: BaseModel | None = None

    # -- the whole turn ---------------------------------------------------------------
    async def run(self) -> TurnResult:
        try:
            await self.segment(self.submit_prompt)
            while self.translator.finish == "tool-calls":
                results = await self.run_tools(self.translator.pending)
                await self.segment(functools.partial(self.submit_results, results))
            return self.result()
        except CoderStreamError as exc:
            raise self.stream_failed(exc) from exc.__cause__
        finally:
            self.remember_cursor()
            if self.stream is not None:
                self.session.seen_usage.update(self.stream.ledger.usage)
                await self.stream.aclose()

    async def segment(self, submit: Callable[[], Awaitable[None]]) -> None:
        """Submit, then read until settled; bounded by ``request_timeout`` as one clock."""
        number, emit = self.session.next_segment(), self.client.emit
        emit(SegmentStart(number, self.session.chat_id))
        started = time.monotonic()

        def settled(status: str | None, failure: BaseException | None = None) -> None:
            emit(
                SegmentSettle(
                    number,
                    self.session.chat_id,
                    time.monotonic() - started,
                    status=status,
                    finish_reason=self.translator.finish if failure is None else None,
                    error_name=None if failure is None else type(failure).__name__,
                    error_message=None if failure is None else str(failure),
                )
            )

        try:
            await self.submit_and_read(submit)
        except BaseException as exc:
            settled(self.translator.status, exc)
            raise
        if self.translator.finish == "error":
            error = self.chat_error(self.translator.error)
            settled("error", error)
            raise error
        settled(self.translator.status)

    async def submit_and_read(self, submit: Callable[[], Awaitable[None]]) -> None:
        try:
            async with asyncio.timeout(self.options.request_timeout) as clock:
                await submit()
                await self.read_until_settled()
        except TimeoutError:
            if not clock.expired():
                raise
            raise await self.timed_out() from None

    # -- submitting -----------------------------------------------------------------------
    async def submit_prompt(self) -> None:
        session = self.session
        await self.resolve_model()
        if session.chat_id is None:
            await self.create_chat()
            return
        cursor = session.last_seen_message_id
        if cursor is None:
            page = await self.client.get_messages(session.chat_id, limit=1)
            cursor = page.messages[0].id if page.messages else 0
        await self.before_action("send")
        self.send_unanswered, self.sent_after = True, cursor or 0
        self.prompt_unsent = False
        response = await self.client.send_message(
            session.chat_id, self.prompt, model_config_id=self.session.model_config_id
        )
        self.send_unanswered = False
        if self.story is not None:
            self.story.sent(self.prompt)
        if not response.queued and response.message is not None:
            self.translator.anchor_id = response.message.id
        else:
            self.translator.anchor_text = self.prompt
            self.queued_id = response.queued_message.id if response.queued_message else None
        await self.open_stream(session.chat_id, cursor or None)

    async def resolve_model(self) -> None:
        session = self.session
        if session.options.model and not session.model_resolved:
            configs = await self.client.model_configs(organization_id=session.organization_id)
            session.model_config_id = resolve_model_hint(session.options.model, configs)
            session.model_resolved = True

    async def create_chat(self) -> None:
        opts = self.options
        await self.before_action("create")
        self.prompt_unsent = False
        chat = await self.client.create_chat(
            organization_id=self.session.organization_id,
            content=self.prompt,
            system_prompt=opts.system_prompt,
            workspace_id=opts.workspace_id,
            model_config_id=self.session.model_config_id,
            mcp_server_ids=list(opts.mcp_server_ids) or None,
            labels=dict(opts.labels) or None,
            tools=[t.declaration() for t in self.declared_tools()],
        )
        self.session.chat_id = self.session.last_known_chat_id = chat.id
        self.created_chat = True
        if self.story is not None:
            self.story.sent(self.prompt)
        self.translator.anchor_text = self.prompt
        await self.open_stream(chat.id, None)

    def declared_tools(self) -> list[ClientTool]:
        """What the new chat declares: the session's tools, and this turn's structured
        answer unless the session declares its own (a workflow whose every step may ask
        for one declares a permissive ``structured_output`` once, at creation)."""
        declared = {t.name: t for t in self.session.tools}
        for name, tool in self.tools.items():
            declared.setdefault(name, tool)
        return list(declared.values())

    async def open_stream(self, chat_id: str, after_id: int | None) -> None:
        self.stream = ChatStream(
            self.client,
            chat_id,
            after_id,
            redial_initial=self.options.redial_initial,
            max_failures=self.options.redial_max_failures,
            emit=None if self.story is None else _StoryEmitter(self.client.emit, self.told),
        )
        await self.stream.start()

    def told(self, event: TransportEvent) -> None:
        """A dropped stream and its return, in the story."""
        assert self.story is not None
        if isinstance(event, WsRedial):
            self.story.reconnecting(event.consecutive_failures, event.backoff)
            self._redialled = True
        elif isinstance(event, WsOpen) and self._redialled:
            self.story.reconnected()
            self._redialled = False

    async def submit_results(self, results: list[dict[str, Any]]) -> None:
        assert self.session.chat_id is not None
        await self.before_action("tool-results")
        try:
            await self.client.submit_tool_results(self.session.chat_id, results)
        except CoderApiError as exc:
            # The server no longer waits on these calls: its tool deadline answered
            # them ("Tool execution timed out") while the tools ran, or an interrupt
            # did. Keep reading: the turn goes on, maybe with a new call to answer.
            if exc.status not in (400, 409) or exc.method != "POST":
                raise
        self.translator.resume([r["tool_call_id"] for r in results])

    # -- reading -----------------------------------------------------------------------------
    async def read_until_settled(self) -> None:
        assert self.stream is not None
        translator, grace = self.translator, self.options.action_grace
        while translator.finish is None:
            if translator.awaiting_action:
                try:
                    event = await asyncio.wait_for(self.stream.next(), grace)
                except TimeoutError:
                    await self.recover_action()
                    continue
            else:
                event = await self.stream.next()
            translator.ingest(event)
            if translator.opened:
                self.queued_id = None
                if self.story is not None and isinstance(event, MessageEvent):
                    self.story.seen(event.message)
        if translator.finish == "error" and translator.error is None:
            await self.find_error()

    async def recover_action(self) -> None:
        """``requires_action`` without its event: derive the pending calls from history."""
        assert self.session.chat_id is not None
        page = await self.client.get_messages(self.session.chat_id, limit=200)
        pending = pending_calls(page.messages, exclude=self.translator.answered)
        self.translator.offer_calls(pending.requests())

    async def find_error(self) -> None:
        assert self.stream is not None and self.session.chat_id is not None
        with contextlib.suppress(CoderError):
            while (event := self.stream.next_nowait()) is not None:
                self.translator.ingest(event)
        if self.translator.error is None:
            chat = await self.client.get_chat(self.session.chat_id)
            self.translator.error = chat.last_error or ChatErrorInfo()

    # -- client tools -------------------------------------------------------------------------
    async def run_tools(self, calls: list[ToolCallRequest]) -> list[dict[str, Any]]:
        results = []
        for call in calls:
            output, is_error = await self.run_tool(call)
            results.append(
                {"tool_call_id": call.tool_call_id, "output": output, "is_error": is_error}
            )
        return results

    async def run_tool(self, call: ToolCallRequest) -> tuple[Any, bool]:
        tool = self.tools.get(call.tool_name)
        if tool is None:
            return f"Tool {call.tool_name!r} is not available in this session.", True
        try:
            args = tool.validate(call.args)
        except ToolArgumentsError as exc:
            return str(exc), True
        if tool.function is None:  # structured_output: the arguments are the answer
            self.structured = args
            return {"ok": True}, False
        assert self.session.chat_id is not None
        context = ToolCallContext(
            self.session.organization_id, self.session.chat_id, call.tool_call_id
        )
        if self.story is not None:
            self.story.client_call(call.tool_name, call.args)
        output, is_error = await self.invoke(tool, args, context)
        if self.story is not None:
            self.story.client_result(call.tool_name, output, is_error)
        return output, is_error

    async def invoke(
        self, tool: ClientTool, args: BaseModel, context: ToolCallContext
    ) -> tuple[Any, bool]:
        try:
            return tool_output(await tool.invoke(args, context)), False
        except (CoderStoreError, CoderToolError):
            # The durable ledger around the tool failed, or a durable effect's outcome is
            # unknown: the turn stops here (the pause stays on the server) and recovery
            # decides from the ledger, running the call again under the same key.
            raise
        except ToolFailed as exc:
            return str(exc), True
        except Exception as exc:  # noqa: BLE001 - the model sees the failure and may retry
            return f"{type(exc).__name__}: {exc}", True

    # -- endings ----------------------------------------------------------------------------------
    def result(self) -> TurnResult:
        translator = self.translator
        messages = translator.messages
        output: Any = None
        if self.output_type is not None:
            found = structured_output(to_transcript(messages).messages, self.output_type)
            output = found or self.structured
            if output is None:
                raise CoderChatError(
                    "the turn finished without a valid structured_output call",
                    kind="structured_output_missing",
                    retryable=False,
                    chat_id=self.session.chat_id,
                )
        assert self.session.chat_id is not None
        return TurnResult(
            text=turn_text(messages, set(self.tools)),
            finish_reason=translator.finish or "stop",
            usage=translator.usage(),
            steps=build_steps(messages),
            chat_id=self.session.chat_id,
            last_seen_message_id=self.cursor(),
            output=output,
        )

    def chat_error(self, info: ChatErrorInfo | None) -> CoderChatError:
        info = info or ChatErrorInfo()
        return CoderChatError(
            info.message,
            kind=info.kind,
            retryable=info.retryable,
            chat_id=self.session.chat_id,
            provider=info.provider,
            status_code=info.status_code,
            detail=info.detail,
        )

    async def stop_server(self) -> None:
        """Best effort, bounded: withdraw this turn's still-queued prompt, else interrupt.

        A prompt queued behind someone else's run must not stop that run, nor be
        left behind to run unattended. What became of it is kept as the session's
        ``last_stop``: whether an attempt was cut short depends on it.
        """
        chat_id = self.session.chat_id or self.session.last_known_chat_id
        if chat_id is None:
            return
        outcome: StopOutcome = "unknown"
        told: str | None = None  # the story's word for it, when not the outcome's own
        sending = False  # until the checks before acting passed, nothing can have left
        try:
            async with asyncio.timeout(self.options.interrupt_timeout):
                await self.before_action("interrupt")
                if self.prompt_unsent:
                    outcome, told = "undelivered", "unsent"  # nothing of ours to stop
                    return
                if self.send_unanswered and self.queued_id is None:
                    self.queued_id, admitted = await self.find_unanswered_send(chat_id)
                    if self.queued_id is None and not admitted:
                        outcome, told = "undelivered", "absent"  # nothing of ours to stop
                        return
                if self.queued_id is not None and not self.translator.opened:
                    sending = True
                    await self.client.delete_queued_message(chat_id, self.queued_id)
                    outcome = "withdrawn"
                else:
                    at = datetime.now(UTC)
                    await self.before_interrupt(chat_id, at)
                    self.session.last_stop_at, sending = at, True
                    await self.client.interrupt_chat(chat_id)
                    outcome = "interrupted"
        except CoderApiError as exc:
            # 409 to an interrupt: nothing was running, the run had ended by itself.
            idle = exc.status == 409 and exc.path.endswith("/interrupt")
            outcome = "idle" if idle else "unknown" if sending else "undelivered"
        except CoderTransportError as exc:
            # Before ``sending``, only reads of the chat were made: nothing was stopped.
            outcome = "unknown" if exc.sent and sending else "undelivered"
        except (CoderError, TimeoutError):
            # A check before acting failed (the store out of reach, say): nothing was sent.
            outcome = "unknown" if sending else "undelivered"
        finally:
            self.session.last_stop = outcome
            if self.story is not None:
                self.story.stopped(told or outcome)

    async def find_unanswered_send(self, chat_id: str) -> tuple[int | None, bool]:
        """Where a send whose answer never came put the prompt: its queue entry's id, if
        it waits behind another run (the newest entry with its text), and whether it was
        admitted (a user message with its text after the cursor the send began at). The
        run it waits behind may be someone else's: only what is ours is stopped."""
        page = await self.client.get_messages(chat_id)
        text = self.prompt.strip()
        queued = [q.id for q in page.queued_messages if q.text().strip() == text]
        if queued:
            return queued[-1], False
        after = await self.client.get_messages(chat_id, after_id=self.sent_after)
        admitted = any(m.role == "user" and m.text().strip() == text for m in after.messages)
        return None, admitted

    async def timed_out(self) -> CoderChatError:
        """The segment's clock ran out: interrupt best-effort, withdraw a queued prompt."""
        chat_id = self.session.chat_id
        await self.stop_server()
        return CoderChatError(
            f"the turn did not settle within request_timeout={self.options.request_timeout}s",
            kind="timeout",
            retryable=True,
            chat_id=chat_id,
        )

    def stream_failed(self, exc: CoderStreamError) -> CoderStreamError:
        """Discard a chat this turn created; say whether a fresh retry is safe."""
        chat_id = exc.chat_id or self.session.chat_id
        opts = self.options
        clean = self.created_chat and not opts.workspace_id and not opts.mcp_server_ids
        if self.created_chat:
            self.session.chat_id = None
            self.session.last_seen_message_id = None
        return CoderStreamError(str(exc), chat_id=chat_id, retryable=clean)

    def cursor(self) -> int | None:
        seen = self.stream.cursor if self.stream is not None else 0
        current = self.session.last_seen_message_id or 0
        best = max(seen, current)
        return best or None

    def remember_cursor(self) -> None:
        if self.session.chat_id is not None:
            self.session.last_seen_message_id = self.cursor()


class _StoryEmitter(Emitter):
    """The client's emitter, with the story told of the stream's redials: as enabled as
    the client's own, so the story costs nothing per stream event."""

    def __init__(self, inner: Emitter, tell: Callable[[TransportEvent], None]) -> None:
        super().__init__(None)
        self._inner, self._tell = inner, tell

    @property
    def enabled(self) -> bool:
        return self._inner.enabled

    def __call__(self, event: TransportEvent) -> None:
        self._inner(event)
        if isinstance(event, WsRedial | WsOpen):
            self._tell(event)
