"""Operations only tests and benchmarks perform: seeding, history rewrites, inspection."""

from __future__ import annotations

import uuid
from datetime import timedelta

from .engine import Engine
from .errors import bad_request
from .state import JSON, Chat, Message, PendingCall, now

SEEDABLE = frozenset({"waiting", "error", "running", "requires_action"})


def seed_chats(
    engine: Engine,
    count: int,
    *,
    labels: dict[str, str] | None = None,
    status: str = "waiting",
    archived: bool = False,
    age_seconds: float = 0.0,
    tool_name: str = "seeded_tool",
) -> list[uuid.UUID]:
    """Create ``count`` chats at once, with one finished exchange each and no model run.

    A seeded ``running`` chat has no run behind it: it stays running until it is
    interrupted (a stuck turn). A seeded ``requires_action`` chat waits on one
    call to ``tool_name``.
    """
    if status not in SEEDABLE:
        raise bad_request(f"status must be one of {sorted(SEEDABLE)}")
    if archived and status not in ("waiting", "error"):
        raise bad_request("only idle chats can be seeded archived")
    created = now() - timedelta(seconds=age_seconds)
    cfg, ids = engine.config, []
    for index in range(count):
        chat = Chat(
            id=uuid.uuid4(),
            organization_id=cfg.organization_id,
            owner_id=cfg.owner_id,
            owner_username=cfg.owner_username,
            title=f"Seeded chat {index}",
            labels=dict(labels or {}),
            dynamic_tools=[{"name": tool_name, "description": "", "input_schema": {}}],
            status=status,
            archived=archived,
            created_at=created,
            updated_at=created,
        )
        _seed_history(engine, chat, index)
        if status == "requires_action":
            call = PendingCall(f"call_seed_{index}", tool_name, {})
            chat.pending_calls = [call]
            _add(
                engine,
                chat,
                "assistant",
                [
                    {
                        "type": "tool-call",
                        "tool_call_id": call.tool_call_id,
                        "tool_name": tool_name,
                        "args": {},
                    }
                ],
            )
        if status == "error":
            chat.last_error = {"message": "Seeded failure.", "kind": "generic", "retryable": False}
        engine.chats[chat.id] = chat
        ids.append(chat.id)
    return ids


def _seed_history(engine: Engine, chat: Chat, index: int) -> None:
    _add(engine, chat, "user", [{"type": "text", "text": f"seeded prompt {index}"}])
    if chat.status in ("waiting", "error"):
        _add(
            engine,
            chat,
            "assistant",
            [{"type": "text", "text": f'You said: "seeded prompt {index}"'}],
        )


def _add(engine: Engine, chat: Chat, role: str, content: list[JSON]) -> None:
    message = Message(engine.ids.message_id(), chat.id, role, content, created_at=chat.created_at)
    chat.messages.append(message)
    chat.history_version += 1


def reset_history(engine: Engine, chat: Chat) -> None:
    """Make every open stream send ``history_reset`` followed by the full history."""
    chat.reset_epoch += 1
    chat.history_version += 1
    chat.deltas = []
    engine.publish(chat)


def revise_message(engine: Engine, chat: Chat, message_id: int, text: str) -> Message:
    """Re-send a committed message with new text and a higher revision."""
    message = chat.message_by_id(message_id)
    if message is None or not message.visible:
        raise bad_request(f"chat has no message {message_id}")
    message.content = [p for p in message.content if p.get("type") != "text"] + [
        {"type": "text", "text": text}
    ]
    message.revision += 1
    chat.history_version += 1
    chat.deltas = []  # a history change ends the preview episode; seq restarts at 1
    engine.publish(chat)
    return message


def chat_record(chat: Chat) -> JSON:
    """Everything the server holds about a chat, hidden rows included."""
    return {
        **chat.to_wire(),
        "messages": [
            {**m.to_wire(), "visible": m.visible, "revision": m.revision} for m in chat.messages
        ],
        "queued_messages": [q.to_wire() for q in chat.queue],
        "pending_calls": [c.to_wire() for c in chat.pending_calls],
        "dynamic_tools": chat.dynamic_tools,
        "system_prompt": chat.system_prompt,
    }
