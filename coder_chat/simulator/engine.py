"""The simulated chat daemon: chats, their state machine, and who hears about changes.

Every mutation follows the era-C transition table (wire reference 4.3) and ends
with one :meth:`Engine.publish`, which brings every open stream up to date in
the section 5.3 order and tells ``/watch`` sockets. The scripted model
(:mod:`.model`) drives runs through the same methods a real worker would use:
commit a step, stream a delta, pause for client tools, finish or fail a turn.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from . import validation as check
from .config import SimulatorConfig
from .errors import ApiError, bad_request, conflict, not_found
from .faults import FaultPlan
from .records import ArchiveRecord, InterruptRecord, Records, ToolResultRecord, TurnRecord
from .spending import over_limit, refuse_over_limit
from .state import JSON, Chat, Counters, Message, PendingCall, QueuedMessage, StoredFile, now
from .stream import Subscriber

INTERRUPTED_BY_USER = "Tool execution interrupted by user"
INTERRUPTED_BY_MESSAGE = "Tool execution interrupted by user message"
TIMED_OUT = "Tool execution timed out"


@dataclass
class ToolOutcome:
    """A tool call's answer as the model sees it."""

    call: PendingCall
    output: Any
    is_error: bool
    synthetic: bool = False


@dataclass
class Run:
    """One turn being generated for a chat."""

    chat: Chat
    prompt: str
    interrupted: asyncio.Event = field(default_factory=asyncio.Event)
    tool_answer: asyncio.Future[list[ToolOutcome]] | None = None
    task: asyncio.Task[None] | None = None
    started: float = field(default_factory=time.perf_counter)


@dataclass
class Script:
    """A scripted reply: prompts containing ``when`` get the directives ``then``, every
    time, or the next ``times`` times."""

    when: str
    then: str
    times: int | None = None


class Engine:
    """All chats of one simulated deployment (one organization, one user)."""

    def __init__(self, config: SimulatorConfig, faults: FaultPlan) -> None:
        self.config = config
        self.faults = faults
        self.records = Records()
        self.ids = Counters()
        self.chats: dict[uuid.UUID, Chat] = {}
        self.files: dict[uuid.UUID, StoredFile] = {}
        self.workspaces: set[uuid.UUID] = {uuid.uuid4()}
        self.mcp_servers: set[uuid.UUID] = {uuid.uuid4()}
        self.model_configs = _default_model_configs()
        self.runs: dict[uuid.UUID, Run] = {}
        self.subscribers: dict[uuid.UUID, set[Subscriber]] = {}
        self.watchers: set[asyncio.Queue[JSON]] = set()
        self._background: set[asyncio.Task[None]] = set()
        #: Scripted replies: a prompt containing ``when`` is answered as if ``then``
        #: (directives) were written in it, so tests can script natural prompts.
        self.scripts: list[Script] = []
        #: When the current usage period began (its limit resets ``usage_period`` later).
        self.period_start = now()

    def over_limit(self) -> JSON | None:
        """Coder's figures when the user reached their usage limit, else ``None``."""
        cfg = self.config
        return over_limit(
            self.chats.values(), cfg.usage_limit_micros, self.period_start, cfg.usage_period
        )

    def scripted(self, prompt: str) -> str:
        """The prompt as the model reads it: with the directives of every matching script
        (a script with a count of uses left loses one; used up, it is gone)."""
        matching = [script for script in self.scripts if script.when in prompt]
        for script in matching:
            if script.times is not None:
                script.times -= 1
        self.scripts = [s for s in self.scripts if s.times is None or s.times > 0]
        return " ".join([prompt, *(s.then for s in matching)]) if matching else prompt

    # -- lookups --------------------------------------------------------------
    def chat(self, chat_id: uuid.UUID) -> Chat:
        chat = self.chats.get(chat_id)
        if chat is None:
            raise not_found()
        return chat

    # -- create ---------------------------------------------------------------
    def create_chat(self, body: JSON) -> Chat:
        """``POST /chats``: validate in the handler's order, insert, start the first turn."""
        cfg = self.config
        if not body.get("organization_id"):
            raise bad_request("organization_id is required.")
        org = check.parse_uuid(body["organization_id"], "Invalid organization_id.")
        if org != cfg.organization_id:
            raise ApiError(403, "You are not a member of the specified organization.")
        system_prompt = str(body.get("system_prompt") or "")
        if len(system_prompt) > check.MAX_SYSTEM_PROMPT:
            raise bad_request("System prompt exceeds maximum length.")
        parts = check.input_parts(body.get("content"), self.files)
        workspace = self._workspace(body.get("workspace_id"))
        # Omitted: the chat runs on the server's default model, and says so.
        model_config = self._model_config(body.get("model_config_id")) or self._default_model()
        mcp = self._mcp_servers(body.get("mcp_server_ids"))
        labels = check.labels(body.get("labels"))
        tools = check.dynamic_tools(body.get("unsafe_dynamic_tools"))
        client_type = body.get("client_type") or "api"
        if client_type not in ("ui", "api"):
            raise bad_request("Invalid client_type.")
        plan_mode = body.get("plan_mode") or ""
        if plan_mode not in ("", "plan"):
            raise bad_request("Invalid plan_mode value.")
        refuse_over_limit(self.over_limit())
        chat = Chat(
            id=uuid.uuid4(),
            organization_id=org,
            owner_id=cfg.owner_id,
            owner_username=cfg.owner_username,
            title=check.title_from_prompt(parts),
            labels=labels,
            dynamic_tools=tools,
            workspace_id=workspace,
            mcp_server_ids=mcp,
            model_config_id=model_config,
            system_prompt=system_prompt,
            plan_mode=plan_mode,
            client_type=client_type,
            status="pending" if cfg.era_b.pending_status else "running",
        )
        self.chats[chat.id] = chat
        self._insert_system_rows(chat)
        self._link_files(chat, parts)
        self.append(chat, "user", parts, created_by=cfg.owner_id)
        self.watch("created", chat)
        self.start_run(chat, _text(parts))
        return chat

    def _insert_system_rows(self, chat: Chat) -> None:
        # Model-only rows, as the real server inserts; they consume message ids.
        self.append(chat, "system", [{"type": "text", "text": "deployment prompt"}], visible=False)
        if chat.system_prompt:
            self.append(
                chat, "system", [{"type": "text", "text": chat.system_prompt}], visible=False
            )

    def _workspace(self, value: Any) -> uuid.UUID | None:
        if not value:
            return None
        workspace = check.parse_uuid(
            value, "Workspace not found or you do not have access to this resource"
        )
        if workspace not in self.workspaces:
            raise bad_request("Workspace not found or you do not have access to this resource")
        return workspace

    def _model_config(self, value: Any) -> uuid.UUID | None:
        if not value:
            return None
        known = {str(m["id"]) for m in self.model_configs if m["enabled"]}
        if str(value) not in known:
            raise bad_request("Invalid model config ID.")
        return uuid.UUID(str(value))

    def _default_model(self) -> uuid.UUID | None:
        """The enabled model config marked default: what a chat created without one uses."""
        for config in self.model_configs:
            if config["enabled"] and config["is_default"]:
                return uuid.UUID(str(config["id"]))
        return None

    def _mcp_servers(self, value: Any) -> list[str]:
        ids = [str(v) for v in value or []]
        unknown = [v for v in ids if v not in {str(s) for s in self.mcp_servers}]
        if unknown:
            raise bad_request(
                "One or more MCP server IDs are invalid or disabled", ", ".join(unknown)
            )
        return ids

    def _link_files(self, chat: Chat, parts: list[JSON]) -> None:
        for part in parts:
            if part["type"] == "file":
                stored = self.files[uuid.UUID(part["file_id"])]
                if stored not in chat.files:
                    chat.files.append(stored)
        del chat.files[:-50]  # a chat keeps at most 50 files; the oldest go first

    # -- send -------------------------------------------------------------------
    def send_message(self, chat: Chat, body: JSON) -> JSON:
        """``POST /chats/{chat}/messages``: admit directly, or queue (wire reference 3.7)."""
        if chat.archived:
            raise bad_request("Cannot send messages to an archived chat.")
        refuse_over_limit(self.over_limit())
        behavior = check.busy_behavior(body.get("busy_behavior"))
        parts = check.input_parts(body.get("content"), self.files)
        model_config = self._model_config(body.get("model_config_id"))
        if body.get("mcp_server_ids") is not None:
            chat.mcp_server_ids = self._mcp_servers(body["mcp_server_ids"])
        self._link_files(chat, parts)
        if not chat.busy and not chat.queue:
            _switch_model(chat, model_config)
            message = self.append(chat, "user", parts, created_by=self.config.owner_id)
            self._set_status(chat, "pending" if self.config.era_b.pending_status else "running")
            chat.last_error = None
            self.publish(chat)
            self.watch("status_change", chat)  # after every send (wire reference 3.7)
            self.start_run(chat, _text(parts))
            return {
                "queued": False,
                "message": message.to_wire(),
                "messages": [message.to_wire()],
                "warnings": [],
            }
        if len(chat.queue) >= self.config.max_queue:
            raise ApiError(
                429,
                "Message queue is full.",
                f"Maximum {self.config.max_queue} messages can be queued.",
            )
        queued = QueuedMessage(self.ids.queue_id(), chat.id, parts, model_config_id=model_config)
        chat.queue.append(queued)
        chat.queue_version += 1
        inserted = self._after_queueing(chat, behavior)
        self.publish(chat)
        self.watch("status_change", chat)
        return {
            "queued": True,
            "queued_message": queued.to_wire(),
            "messages": [m.to_wire() for m in inserted],
            "warnings": [],
        }

    def _after_queueing(self, chat: Chat, behavior: str) -> list[Message]:
        """Apply the busy-state transitions of a queued send; return rows inserted."""
        if chat.status == "error":  # E1: promote the queue head at once
            message = self._promote_head(chat)
            self._set_status(chat, "running")
            chat.last_error = None
            self.start_run(chat, message.text())
            return [message]
        if behavior != "interrupt":
            return []
        if chat.status == "running":
            self._begin_interrupt(chat)
            return []
        if chat.status == "requires_action":
            return self._answer_pending(chat, INTERRUPTED_BY_MESSAGE)
        return []

    # -- interrupt ----------------------------------------------------------------
    def interrupt(self, chat: Chat) -> Chat:
        """``POST /chats/{chat}/interrupt`` (wire reference 3.8)."""
        before = chat.status
        if self.config.era_b.interrupt_always_ok:
            self._interrupt_era_b(chat)
        elif chat.status == "running" and not chat.archived:
            self._begin_interrupt(chat)
        elif chat.status == "requires_action" and not chat.archived:
            self._answer_pending(chat, INTERRUPTED_BY_USER)
        else:
            self.records.interrupts.append(InterruptRecord(chat.id, before, 409))
            raise conflict(
                "Chat is not in an interruptible state.", f'Chat status is "{chat.status}".'
            )
        self.records.interrupts.append(InterruptRecord(chat.id, before, 200))
        self.publish(chat)
        self.watch("status_change", chat)
        return chat

    def _begin_interrupt(self, chat: Chat) -> None:
        self._set_status(chat, "interrupting")
        run = self.runs.get(chat.id)
        if run is None:
            self._spawn(self._wind_down_without_run(chat))
        else:
            run.interrupted.set()

    async def _wind_down_without_run(self, chat: Chat) -> None:
        # A seeded chat marked running has no model task; settle it like one.
        await asyncio.sleep(self.config.interrupt_winddown)
        self.finish_turn(chat)

    def _interrupt_era_b(self, chat: Chat) -> None:
        if chat.status == "requires_action":
            self._insert_results(chat, self._synthetic(chat, INTERRUPTED_BY_USER))
            chat.pending_calls = []
        run = self.runs.pop(chat.id, None)
        if run is not None and run.task is not None:
            run.task.cancel()
        self._set_status(chat, "waiting")

    # -- client tools ----------------------------------------------------------------
    def submit_tool_results(self, chat: Chat, body: JSON) -> None:
        """``POST /chats/{chat}/tool-results`` (wire reference 3.9)."""
        results = body.get("results")
        if not isinstance(results, list) or not results:
            raise bad_request("At least one tool result is required.")
        if chat.archived:
            raise bad_request("Cannot submit tool results to an archived chat.")
        if chat.status != "requires_action":
            raise conflict(
                "Chat is not waiting for tool results.",
                f'chat status is "{chat.status}", expected "requires_action"',
            )
        outcomes = self._validate_results(chat, results)
        for outcome in outcomes:
            self.records.tool_results.append(
                ToolResultRecord(
                    chat.id,
                    outcome.call.tool_call_id,
                    outcome.call.tool_name,
                    outcome.output,
                    outcome.is_error,
                    False,
                )
            )
        self._resume_with(chat, outcomes)
        self.publish(chat)
        self.watch("status_change", chat)

    def _validate_results(self, chat: Chat, results: list[Any]) -> list[ToolOutcome]:
        pending = {c.tool_call_id: c for c in chat.pending_calls}
        ids = [str(r.get("tool_call_id", "")) if isinstance(r, dict) else "" for r in results]
        seen: set[str] = set()
        for call_id in ids:
            if call_id in seen:
                raise bad_request(
                    "Duplicate tool_call_id in results.", f'Duplicate tool call ID "{call_id}".'
                )
            seen.add(call_id)
        for call_id in ids:
            if call_id not in pending:
                raise bad_request(
                    "Unexpected tool result.", f'No pending tool call with ID "{call_id}".'
                )
        for call_id, raw in zip(ids, results, strict=True):
            if "output" not in raw:
                raise bad_request(
                    "Tool result output must be valid JSON.",
                    f'Output for tool call "{call_id}" is not valid JSON.',
                )
        for call_id in pending:
            if call_id not in seen:
                raise bad_request(
                    "Missing tool result.", f'Missing result for tool call "{call_id}".'
                )
        return [
            ToolOutcome(pending[i], r["output"], bool(r.get("is_error", False)))
            for i, r in zip(ids, results, strict=True)
        ]

    def enter_requires_action(
        self, run: Run, calls: list[PendingCall]
    ) -> asyncio.Future[list[ToolOutcome]]:
        """Pause the chat on client-tool calls; the future resolves with their answers."""
        chat = run.chat
        chat.pending_calls = calls
        self._set_status(chat, "requires_action")
        run.tool_answer = asyncio.get_running_loop().create_future()
        self.publish(chat)
        self.watch("action_required", chat, tool_calls=[c.to_wire() for c in calls])
        return run.tool_answer

    def time_out_pending(self, chat: Chat) -> None:
        """The server-side tool deadline passed: answer with errors and go on."""
        if chat.status == "requires_action":
            self._answer_pending(chat, TIMED_OUT)
            self.publish(chat)
            self.watch("status_change", chat)

    def _answer_pending(self, chat: Chat, reason: str) -> list[Message]:
        outcomes = self._synthetic(chat, reason)
        for o in outcomes:
            self.records.tool_results.append(
                ToolResultRecord(
                    chat.id, o.call.tool_call_id, o.call.tool_name, o.output, True, True
                )
            )
        return self._resume_with(chat, outcomes)

    def _synthetic(self, chat: Chat, reason: str) -> list[ToolOutcome]:
        return [ToolOutcome(call, reason, True, synthetic=True) for call in chat.pending_calls]

    def _resume_with(self, chat: Chat, outcomes: list[ToolOutcome]) -> list[Message]:
        inserted = self._insert_results(chat, outcomes)
        chat.pending_calls = []
        self._set_status(chat, "pending" if self.config.era_b.pending_status else "running")
        run = self.runs.get(chat.id)
        if run is not None and run.tool_answer is not None and not run.tool_answer.done():
            run.tool_answer.set_result(outcomes)
        elif run is None:
            self.start_run(chat, "", continuation=outcomes)
        return inserted

    def _insert_results(self, chat: Chat, outcomes: list[ToolOutcome]) -> list[Message]:
        return [
            self.append(
                chat,
                "tool",
                [
                    {
                        "type": "tool-result",
                        "tool_call_id": o.call.tool_call_id,
                        "tool_name": o.call.tool_name,
                        "result": o.output,
                        "is_error": o.is_error,
                    }
                ],
            )
            for o in outcomes
        ]

    # -- update / archive ----------------------------------------------------------------
    def update_chat(self, chat: Chat, body: JSON) -> None:
        """``PATCH /chats/{chat}`` (wire reference 3.5)."""
        new_labels = check.labels(body["labels"]) if "labels" in body else None
        title = self._title(body["title"]) if body.get("title") is not None else None
        if "plan_mode" in body and body["plan_mode"] not in ("", "plan", None):
            raise bad_request("Invalid plan_mode value.")
        workspace = self._workspace(body["workspace_id"]) if body.get("workspace_id") else None
        if body.get("archived") is not None:
            self._set_archived(chat, bool(body["archived"]))
        if new_labels is not None:
            chat.labels = new_labels
        if title is not None:
            chat.title = title
            self.watch("title_change", chat)
        if workspace is not None:
            chat.workspace_id = workspace
        if body.get("plan_mode") is not None:
            chat.plan_mode = body["plan_mode"]
        chat.touch()

    def _title(self, value: Any) -> str:
        title = str(value).strip()
        if not title or len(title) > 200:
            raise bad_request("Invalid chat title.", "Title must be between 1 and 200 characters.")
        return title

    def _set_archived(self, chat: Chat, archived: bool) -> None:
        if archived == chat.archived:
            raise bad_request(
                "Chat is already archived." if archived else "Chat is already not archived."
            )
        if archived and chat.busy:
            if not self.config.era_b.archive_interrupts:
                raise conflict(
                    "Cannot archive an active chat. Interrupt or wait for the chat to finish first."
                )
            self._interrupt_era_b(chat)
            self.publish(chat)
        chat.archived = archived
        self.records.archives.append(ArchiveRecord(chat.id, archived))
        self.watch("deleted" if archived else "created", chat)

    # -- queue -------------------------------------------------------------------------
    def delete_queued(self, chat: Chat, queued_id: int) -> None:
        if not chat.queue:
            raise conflict("Chat has no queued messages to delete.")
        entry = next((q for q in chat.queue if q.id == queued_id), None)
        if entry is None:
            raise ApiError(404, "Queued message not found.")
        chat.queue.remove(entry)
        chat.queue_version += 1
        self.publish(chat)

    def promote_queued(self, chat: Chat, queued_id: int) -> None:
        entry = next((q for q in chat.queue if q.id == queued_id), None)
        if entry is None:
            raise ApiError(404, "Queued message not found.")
        chat.queue.remove(entry)
        chat.queue.insert(0, entry)
        chat.queue_version += 1
        if chat.status == "running":
            self._begin_interrupt(chat)
        elif chat.status == "requires_action":
            self._answer_pending(chat, INTERRUPTED_BY_MESSAGE)
        elif chat.status in ("waiting", "error"):
            message = self._promote_head(chat)
            self._set_status(chat, "running")
            self.start_run(chat, message.text())
        self.publish(chat)

    def _promote_head(self, chat: Chat) -> Message:
        head = chat.queue.pop(0)
        chat.queue_version += 1
        _switch_model(chat, head.model_config_id)  # the model it was sent with runs its turn
        return self.append(chat, "user", head.content, created_by=self.config.owner_id)

    # -- what runs use ---------------------------------------------------------------------
    def append(
        self,
        chat: Chat,
        role: str,
        content: list[JSON],
        *,
        usage: JSON | None = None,
        created_by: uuid.UUID | None = None,
        visible: bool = True,
    ) -> Message:
        """Insert a committed row; the episode ends, so the delta buffer empties."""
        message = Message(
            self.ids.message_id(),
            chat.id,
            role,
            content,
            usage=usage,
            created_by=created_by,
            visible=visible,
        )
        chat.messages.append(message)
        if visible:
            chat.history_version += 1
            chat.deltas = []
        chat.touch()
        return message

    def delta(self, chat: Chat, part: JSON) -> None:
        """Stream one preview delta of the in-progress step."""
        hv, ga = chat.episode
        wire = {
            **part,
            "history_version": hv,
            "generation_attempt": ga,
            "seq": len(chat.deltas) + 1,
        }
        chat.deltas.append(wire)
        for subscriber in self.subscribers.get(chat.id, ()):
            subscriber.delta(wire)

    def retry_generation(self, chat: Chat, attempt: int) -> None:
        """A model call failed and is retried: new generation attempt, deltas from seq 1."""
        chat.generation_attempt += 1
        chat.retry_version += 1
        chat.deltas = []
        chat.retry_payload = {
            "attempt": attempt,
            "delay_ms": 0,
            "error": "The model provider is overloaded.",
            "kind": "overloaded",
            "provider": "simulator",
            "status_code": 529,
            "retrying_at": now().isoformat().replace("+00:00", "Z"),
        }
        self.publish(chat)

    def _record_turn(self, chat: Chat, outcome: str) -> None:
        run = self.runs.pop(chat.id, None)
        if run is not None:
            self.records.turns.append(
                TurnRecord(chat.id, outcome, time.perf_counter() - run.started)
            )

    def finish_turn(self, chat: Chat) -> None:
        """The run ended: promote the next queued prompt, or settle in ``waiting``."""
        self._record_turn(chat, "finished")
        if chat.archived:
            return
        if chat.queue:
            message = self._promote_head(chat)
            self._set_status(chat, "pending" if self.config.era_b.pending_status else "running")
            self.publish(chat)
            self.start_run(chat, message.text())
            return
        self._set_status(chat, "waiting")
        self.publish(chat)
        self.watch("status_change", chat)

    def fail_turn(self, chat: Chat, error: JSON) -> None:
        self._record_turn(chat, "failed")
        chat.last_error = error
        self._set_status(chat, "error")
        self.publish(chat)
        self.watch("status_change", chat)

    def start_run(
        self, chat: Chat, prompt: str, continuation: list[ToolOutcome] | None = None
    ) -> None:
        from .model import drive  # the model sits on top of the engine

        run = Run(chat, prompt)
        self.runs[chat.id] = run
        run.task = self._spawn(drive(self, run, continuation))

    def mark_running(self, chat: Chat) -> None:
        """A worker picked up ``pending`` work (era B)."""
        self._set_status(chat, "running")
        self.publish(chat)
        self.watch("status_change", chat)

    def _set_status(self, chat: Chat, status: str) -> None:
        chat.status = status
        chat.touch()

    # -- fan-out ----------------------------------------------------------------------------
    def publish(self, chat: Chat) -> None:
        for subscriber in self.subscribers.get(chat.id, ()):
            subscriber.sync()

    def subscribe(self, chat: Chat, after_id: int) -> Subscriber:
        era_b = self.config.era_b
        subscriber = Subscriber(
            chat,
            after_id,
            withhold_action=lambda: self.faults.take_withhold(chat.id),
            era_b_errors=lambda: era_b.error_before_status,
            era_b_deltas=lambda: era_b.deltas_without_coordinates,
        )
        self.subscribers.setdefault(chat.id, set()).add(subscriber)
        subscriber.sync()
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.get(subscriber.chat.id, set()).discard(subscriber)

    def watch(self, kind: str, chat: Chat, **extra: Any) -> None:
        event = {"kind": kind, "chat": chat.to_wire(light=True), **extra}
        for queue in self.watchers:
            queue.put_nowait(event)

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def close(self) -> None:
        """Stop every run (used when the simulator shuts down)."""
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _switch_model(chat: Chat, model_config: uuid.UUID | None) -> None:
    """A prompt sent with a model runs its turn on it: the chat's last model becomes it."""
    if model_config is not None:
        chat.model_config_id = model_config


def _text(parts: list[JSON]) -> str:
    return " ".join(str(p["text"]) for p in parts if p.get("type") == "text")


def _default_model_configs() -> list[JSON]:
    stamp = now().isoformat().replace("+00:00", "Z")
    return [
        {
            "id": str(uuid.UUID(int=index + 1)),
            "provider": "simulator",
            "model": model,
            "display_name": display,
            "enabled": True,
            "is_default": index == 0,
            "context_limit": 200_000,
            "compression_threshold": 70,
            "created_at": stamp,
            "updated_at": stamp,
        }
        for index, (model, display) in enumerate(
            [("echo-1", "Echo 1"), ("echo-1-mini", "Echo 1 Mini")]
        )
    ]
