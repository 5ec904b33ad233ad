"""The scripted model's directive language.

A directive is a slash word at the start of the prompt or right after whitespace;
anything else, including a marker such as ``[wf-1/step-2]``, is plain text. A
directive's JSON argument runs from its opening brace to the matching closing
brace, so JSON containing spaces, quotes and nested objects is fine.

=======================================  =================================================
``/tool NAME {json-args}``               call the client (dynamic) tool NAME
``/server-tool NAME {json-args}``        call a server-side tool; its effect is recorded
``/deltas N``                            stream the reply in N deltas
``/sleep SECONDS``                       wait before answering (the run stays running);
                                         after a ``/server-tool``, once the tools ran
``/fail retryable|fatal``                end the turn in ``error``
``/json {json}``                         answer by calling ``structured_output``
=======================================  =================================================

Unknown slash words (``/usr/bin``) stay plain text. A known directive with a
malformed argument is a :class:`DirectiveError`, which the simulator reports as
a failed turn so a typo is never silently ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

_WORD = re.compile(r"[a-z][a-z-]*")
_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
_NUMBER = re.compile(r"\d+(\.\d+)?")
_KNOWN = frozenset({"tool", "server-tool", "deltas", "sleep", "fail", "json"})


class DirectiveError(ValueError):
    """A known directive whose argument could not be read."""


@dataclass(frozen=True)
class ToolCall:
    """One tool call the script asks the model to make."""

    name: str
    args: dict[str, Any]


@dataclass
class Script:
    """What a prompt tells the scripted model to do, in the order it does it."""

    text: str = ""
    client_tools: list[ToolCall] = field(default_factory=list)
    server_tools: list[ToolCall] = field(default_factory=list)
    deltas: int | None = None
    sleep: float = 0.0
    #: Seconds of ``/sleep`` written after a ``/server-tool``: waited once the server-side
    #: tools ran, as an agent thinks over what its tools found (a long turn whose tool
    #: calls are seen while it goes on).
    sleep_after_tools: float = 0.0
    fail: Literal["retryable", "fatal"] | None = None
    structured: Any = None
    has_structured: bool = False


def parse(prompt: str) -> Script:
    """Split a prompt into its directives and its plain text."""
    script = Script()
    plain: list[str] = []
    pos = 0
    while pos < len(prompt):
        start = _next_directive(prompt, pos)
        if start is None:
            plain.append(prompt[pos:])
            break
        plain.append(prompt[pos:start])
        pos = _apply(prompt, start, script)
    script.text = " ".join("".join(plain).split())
    return script


def _next_directive(text: str, pos: int) -> int | None:
    """Index of the next known directive's slash at or after ``pos``."""
    while True:
        idx = text.find("/", pos)
        if idx < 0:
            return None
        if idx == 0 or text[idx - 1].isspace():
            word = _WORD.match(text, idx + 1)
            if word and word.group() in _KNOWN and _ends_word(text, word.end()):
                return idx
        pos = idx + 1


def _ends_word(text: str, end: int) -> bool:
    return end == len(text) or text[end].isspace()


def _apply(text: str, start: int, script: Script) -> int:
    """Parse the directive at ``start`` into ``script``; return the index after it."""
    word = _WORD.match(text, start + 1)
    assert word is not None  # guaranteed by _next_directive
    name, pos = word.group(), word.end()
    if name in {"tool", "server-tool"}:
        tool, pos = _token(text, pos, _NAME, f"/{name} needs a tool name", brace_ends=True)
        args, pos = _optional_object(text, pos, f"/{name} {tool}")
        target = script.client_tools if name == "tool" else script.server_tools
        target.append(ToolCall(tool, args))
    elif name == "json":
        value, pos = _json_object(text, _skip_space(text, pos), "/json")
        script.structured, script.has_structured = value, True
    elif name == "deltas":
        count, pos = _token(text, pos, _NUMBER, "/deltas needs a whole number")
        if "." in count or int(count) < 1:
            raise DirectiveError("/deltas needs a whole number of at least 1")
        script.deltas = int(count)
    elif name == "sleep":
        seconds, pos = _token(text, pos, _NUMBER, "/sleep needs a number of seconds")
        if script.server_tools:
            script.sleep_after_tools += float(seconds)
        else:
            script.sleep += float(seconds)
    else:
        mode, pos = _token(text, pos, _WORD, "/fail needs retryable or fatal")
        if mode not in {"retryable", "fatal"}:
            raise DirectiveError(f"/fail takes retryable or fatal, not {mode!r}")
        script.fail = "retryable" if mode == "retryable" else "fatal"
    return pos


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _token(
    text: str, pos: int, pattern: re.Pattern[str], error: str, *, brace_ends: bool = False
) -> tuple[str, int]:
    """The token at ``pos``; it must end at whitespace (or at ``{`` for a tool name)."""
    pos = _skip_space(text, pos)
    match = pattern.match(text, pos)
    if not match:
        raise DirectiveError(error)
    end = match.end()
    if not _ends_word(text, end) and not (brace_ends and text[end] == "{"):
        raise DirectiveError(error)
    return match.group(), end


def _optional_object(text: str, pos: int, what: str) -> tuple[dict[str, Any], int]:
    brace = _skip_space(text, pos)
    if brace >= len(text) or text[brace] != "{":
        return {}, pos
    value, end = _json_object(text, brace, what)
    if not isinstance(value, dict):
        raise DirectiveError(f"{what} takes a JSON object")
    return value, end


def _json_object(text: str, pos: int, what: str) -> tuple[Any, int]:
    """Read the JSON value from the brace at ``pos`` to its matching close."""
    if pos >= len(text) or text[pos] != "{":
        raise DirectiveError(f"{what} needs a JSON object starting with '{{'")
    end = _matching_brace(text, pos)
    if end is None:
        raise DirectiveError(f"{what}: unbalanced braces in its JSON argument")
    try:
        return json.loads(text[pos : end + 1]), end + 1
    except json.JSONDecodeError as exc:
        raise DirectiveError(f"{what}: invalid JSON argument ({exc.msg})") from None


def _matching_brace(text: str, pos: int) -> int | None:
    depth, in_string, escaped = 0, False, False
    for idx in range(pos, len(text)):
        char = text[idx]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return idx
    return None
