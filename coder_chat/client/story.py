"""A turn's story, as it happens, in plain words: the prompt sent, each tool the agent calls
and what came of it, a dropped stream and its reconnect (the reply is the caller's to tell,
with the turn's outcome).

Every line is told once to ``tell`` (a task-run log, in Prefect), shortened, and holds
only what the chat itself holds: prompts, tool names and arguments, outputs, replies.
Never a token or a header: nothing of the transport's own is told.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

from ..protocol.models import ChatMessage, ChatMessagePart

#: Characters of a prompt, an argument list, an output or a reply a line shows.
SHORT = 120

#: What a turn's stop (its deadline, a timeout, a cancellation) did, by its outcome.
STOPPED = {
    "interrupted": "stopped: the agent's run was interrupted.",
    "withdrawn": "stopped: the prompt, still waiting behind another run, was withdrawn "
    "(it will not run unattended).",
    "idle": "stopped: nothing to interrupt, the agent's run had already ended.",
    "unknown": "stopped: Coder was asked to interrupt the agent's run; no answer came.",
    "undelivered": "not stopped: the request to interrupt the agent's run never left.",
    "unsent": "not stopped: the prompt had not been sent, so nothing of this turn runs "
    "in the chat to stop.",
    "absent": "not stopped: the prompt's send got no answer and the prompt is not in the "
    "chat, so nothing of this turn runs there to stop.",
}


class TurnStory:
    """Tells one turn's story to ``tell``, each event once."""

    def __init__(
        self,
        tell: Callable[[str], None],
        *,
        client_tools: frozenset[str] = frozenset(),
        limit: int = SHORT,
    ) -> None:
        self.tell = tell
        #: Told where they run (:meth:`client_call`), not again as the stream carries them.
        self.client_tools = client_tools
        self.limit = limit
        self._seen: set[tuple[str, str]] = set()

    def sent(self, prompt: str) -> None:
        self.tell(f"sent the prompt {self._short(prompt)}.")

    def seen(self, message: ChatMessage) -> None:
        """Server-side tool calls and results in a message the stream delivered."""
        for part in message.content:
            if part.tool_name in self.client_tools:
                continue
            if part.type == "tool-call":
                self._once(part, "call", f"the agent calls {self._call(part)}.")
            elif part.type == "tool-result" and part.result is not None:
                self._once(part, "result", self._result(part.tool_name, part.result, part.is_error))

    def client_call(self, name: str, args: Any) -> None:
        self.tell(f"the agent calls client tool {name}({self._args(args)}); running it here.")

    def client_result(self, name: str, output: Any, is_error: bool) -> None:
        self.tell(self._result(name, output, is_error))

    def stopped(self, outcome: str) -> None:
        self.tell(STOPPED[outcome])

    def reconnecting(self, failures: int, delay: float) -> None:
        self.tell(f"the stream dropped ({failures} in a row); reconnecting in {delay:.1f} s.")

    def reconnected(self) -> None:
        self.tell("the stream is back; nothing it carried is lost.")

    # -- wording ----------------------------------------------------------------------------
    def _once(self, part: ChatMessagePart, kind: str, line: str) -> None:
        key = (kind, part.tool_call_id or "")
        if key not in self._seen:
            self._seen.add(key)
            self.tell(line)

    def _call(self, part: ChatMessagePart) -> str:
        return f"{part.tool_name or 'a tool'}({self._args(part.args)})"

    def _result(self, name: str | None, output: Any, is_error: bool | None) -> str:
        verb = "failed" if is_error else "returned"
        return f"{name or 'the tool'} {verb}: {self._short(_plain(output))}."

    def _args(self, args: Any) -> str:
        if isinstance(args, str) and args.lstrip().startswith("{"):
            with contextlib.suppress(ValueError):  # else told as it came
                args = json.loads(args)
        if isinstance(args, dict):
            text = ", ".join(f"{k}: {_plain(v)}" for k, v in args.items())
        else:
            text = _plain(args) if args not in (None, "") else ""
        return self._clip(text)

    def _short(self, text: str) -> str:
        return repr(self._clip(text))

    def _clip(self, text: str) -> str:
        flat = " ".join(text.split())
        return flat if len(flat) <= self.limit else flat[: self.limit - 1] + "…"


def _plain(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        return str(value)
