"""Client tools from plain async callables.

The tool's name is the function's name, its description the docstring, and its
JSON schema comes from the typed parameters (through a pydantic model, which
also validates the model's arguments before the function runs). A parameter
named ``idempotency_key`` is left out of the schema: the session passes the key
``<organization>/<chat_id>/<tool_call_id>`` there, so an external system can
de-duplicate a re-driven call.
"""

from __future__ import annotations

import inspect
import json
import typing
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from ..errors import CoderConfigError
from ..protocol.models import DynamicTool
from ..protocol.transcript import STRUCTURED_OUTPUT, call_args

IDEMPOTENCY_KEY = "idempotency_key"
ToolFunction = Callable[..., Awaitable[Any]]


class ToolArgumentsError(ValueError):
    """The model's arguments do not fit the tool's parameters."""


class ToolFailed(Exception):
    """Raised by a tool to say its call failed for good (a declined card): the message is
    what the model is told. A durable tool's ledger records it as the call's outcome; any
    other exception from a durable tool leaves its outcome unknown (see ``CoderToolError``).
    """


@dataclass(frozen=True)
class ToolCallContext:
    """Which call of which chat a tool is running for."""

    organization_id: str
    chat_id: str
    tool_call_id: str

    @property
    def idempotency_key(self) -> str:
        """``<organization>/<chat_id>/<tool_call_id>``: unique per call, stable across retries."""
        return f"{self.organization_id}/{self.chat_id}/{self.tool_call_id}"


#: Wraps a tool's execution (the durable layer puts its ledger here).
Interceptor = Callable[["ClientTool", BaseModel, ToolCallContext], Awaitable[Any]]


@dataclass(frozen=True)
class ClientTool:
    """A callable the model may call, with its declaration and argument validator."""

    name: str
    description: str
    arguments: type[BaseModel]
    function: ToolFunction | None
    takes_idempotency_key: bool = False
    interceptor: Interceptor | None = None

    def declaration(self) -> DynamicTool:
        return DynamicTool(
            name=self.name, description=self.description, input_schema=_input_schema(self.arguments)
        )

    def validate(self, raw_args: Any) -> BaseModel:
        try:
            return self.arguments.model_validate(call_args(raw_args))
        except ValidationError as exc:
            raise ToolArgumentsError(_summary(exc)) from None

    async def invoke(self, args: BaseModel, context: ToolCallContext) -> Any:
        """Run the tool for one call (through its interceptor, if it has one)."""
        if self.interceptor is not None:
            return await self.interceptor(self, args, context)
        return await self.call_function(args, context.idempotency_key)

    async def call_function(self, args: BaseModel, idempotency_key: str) -> Any:
        """Call the function itself with validated arguments."""
        if self.function is None:
            raise CoderConfigError(f"tool {self.name} has no function to call")
        kwargs = {name: getattr(args, name) for name in type(args).model_fields}
        if self.takes_idempotency_key:
            kwargs[IDEMPOTENCY_KEY] = idempotency_key
        return await self.function(**kwargs)


#: Each arguments model's schema as JSON, made once: every chat a fleet creates declares
#: its tools again, and pydantic builds a schema afresh each time it is asked (about a
#: millisecond; parsing the text back is a hundredth of that). Weak keys: a plain tool
#: wrapped per step makes a model that should not outlive it.
_SCHEMAS: weakref.WeakKeyDictionary[type[BaseModel], str] = weakref.WeakKeyDictionary()


def _input_schema(arguments: type[BaseModel]) -> dict[str, Any]:
    """``arguments``' JSON schema without its title, a fresh copy for each caller."""
    text = _SCHEMAS.get(arguments)
    if text is None:
        schema = arguments.model_json_schema()
        schema.pop("title", None)
        text = _SCHEMAS[arguments] = json.dumps(schema)
    parsed: dict[str, Any] = json.loads(text)
    return parsed


def client_tool(function: ToolFunction | ClientTool) -> ClientTool:
    """Describe an async callable as a client tool."""
    if isinstance(function, ClientTool):
        return function
    if not inspect.iscoroutinefunction(function):
        raise CoderConfigError(
            f"tool {getattr(function, '__name__', function)!r} must be an async function"
        )
    name = function.__name__
    hints = typing.get_type_hints(function)
    fields: dict[str, Any] = {}
    takes_key = False
    for param in inspect.signature(function).parameters.values():
        if param.name == IDEMPOTENCY_KEY:
            takes_key = True
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise CoderConfigError(f"tool {name}: *args/**kwargs cannot be described to the model")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    description = inspect.getdoc(function) or ""
    return ClientTool(name, description, model, function, takes_key)


def structured_output_tool(model: type[BaseModel]) -> ClientTool:
    """The ``structured_output`` tool: the model answers by calling it with ``model``'s fields."""
    return ClientTool(
        STRUCTURED_OUTPUT,
        f"Call this exactly once with your final answer, matching the {model.__name__} schema.",
        model,
        None,
    )


def tool_output(value: Any) -> Any:
    """A tool's return value as JSON the server accepts."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def _summary(exc: ValidationError) -> str:
    problems = [
        f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
    ]
    return "invalid arguments: " + "; ".join(problems)
