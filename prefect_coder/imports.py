"""Objects named by import path (``module:attribute``): how the UI's form names a
workflow's tools and its output schema."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Sequence
from typing import Any, ParamSpec, TypeVar

from pydantic import BaseModel

from coder_chat import CoderConfigError
from coder_chat.client.tools import ToolFunction
from coder_chat.durable.context import StepTools
from coder_chat.durable.tools import DurableTool

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


def import_object(path: str) -> Any:
    """``module:attribute`` → the object (how tools and output schemas are chosen in the UI)."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise CoderConfigError(f"{path!r} is not an import path of the form module:attribute")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CoderConfigError(f"cannot import {module_name!r} for {path!r}: {exc}") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise CoderConfigError(f"{module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


#: A client tool as a flow names it: the object, or its import path (``module:function``).
ToolLike = DurableTool | ToolFunction | str


def import_tools(paths: Sequence[str]) -> list[Any]:
    tools = [import_object(p) for p in paths]
    for path, tool in zip(paths, tools, strict=True):
        if not isinstance(tool, DurableTool) and not asyncio.iscoroutinefunction(tool):
            raise CoderConfigError(f"{path} is neither a durable tool nor an async function")
    return tools


def resolve_tools(tools: Sequence[ToolLike], *, allow_plain: bool = False) -> StepTools:
    """A workflow's client tools, imported where given by path and checked: once per run."""
    resolved = [import_tools([t])[0] if isinstance(t, str) else t for t in tools]
    return StepTools.build(resolved, allow_plain=allow_plain)


def import_model(path: str | None) -> type[BaseModel] | None:
    if not path:
        return None
    model = import_object(path)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise CoderConfigError(f"{path} is not a pydantic model")
    return model
