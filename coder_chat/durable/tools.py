"""``durable_tool``: client tools whose effect runs at most once per call.

Around each call the ledger keeps a write-ahead record keyed by
``(tenant, chat_id, tool_call_id)``:

1. ``committing`` is written *before* the effect (no entry proves it never started);
2. the function runs with ``idempotency_key=<tenant>/<chat_id>/<tool_call_id>``,
   which it hands to the external system, so a re-drive cannot apply it twice;
3. ``done`` is written with the output.

Recovery (:mod:`.reconcile`) answers a call from a ``done`` entry and re-drives a
``committing`` one with the same key. One more rule covers Coder's server-side
tool deadline: when the server timed a pause out and the model calls the same
tool again in the same step with identical arguments, the new call is answered
from the earlier call's entry instead of running the effect again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from ..client.tools import (
    ClientTool,
    ToolCallContext,
    ToolFailed,
    ToolFunction,
    client_tool,
    tool_output,
)
from ..errors import CoderError, CoderToolError
from .records import Fence, LedgerEntry, args_digest, ledger_key
from .store import DurableStore

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


@dataclass(frozen=True)
class LedgerBinding:
    """What a durable tool needs at run time: the store, the run's fence, the step."""

    store: DurableStore
    fence: Fence
    marker: str

    @property
    def tenant(self) -> str:
        return self.fence.tenant


class DurableTool:
    """A client tool with a crash-safe effect. Create it with :func:`durable_tool`."""

    def __init__(self, function: ToolFunction) -> None:
        self.tool = client_tool(function)
        self.function = function
        self.name = self.tool.name
        self.__doc__ = function.__doc__
        self.__name__ = self.name

    def __repr__(self) -> str:
        return f"durable_tool({self.name})"

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling it directly calls the function (no ledger)."""
        return await self.function(*args, **kwargs)

    def bind(self, binding: LedgerBinding) -> ClientTool:
        """The tool a session runs, with the ledger around every call."""

        async def intercept(tool: ClientTool, args: BaseModel, call: ToolCallContext) -> Any:
            return await self._run(binding, args, call)

        return ClientTool(
            self.tool.name,
            self.tool.description,
            self.tool.arguments,
            self.tool.function,
            self.tool.takes_idempotency_key,
            intercept,
        )

    async def _run(self, b: LedgerBinding, args: BaseModel, call: ToolCallContext) -> Any:
        digest = args_digest(args.model_dump(mode="json"))
        won, entry = await b.store.claim_tool(
            b.fence,
            call.chat_id,
            call.tool_call_id,
            tool_name=self.name,
            marker=b.marker,
            args_digest=digest,
        )
        if not won and entry.state == "done":
            return entry.output
        prior = await self.same_step_call(b, call.chat_id, digest, exclude=call.tool_call_id)
        if prior is not None:
            output = prior.output if prior.state == "done" else await self.redrive(b, prior, args)
        else:
            key = ledger_key(b.tenant, call.chat_id, call.tool_call_id)
            output = await self._effect(b, call.chat_id, call.tool_call_id, args, key)
        await b.store.complete_tool(b.fence, call.chat_id, call.tool_call_id, output=output)
        return output

    async def _effect(
        self, b: LedgerBinding, chat_id: str, tool_call_id: str, args: BaseModel, key: str
    ) -> Any:
        """Run the effect under ``key``. A :class:`ToolFailed` is its outcome (recorded
        ``done``, as an error, then raised for the model to see); any other exception
        leaves the outcome unknown, and the entry ``committing`` for recovery."""
        try:
            return tool_output(await self.tool.call_function(args, key))
        except ToolFailed as exc:
            await b.store.complete_tool(
                b.fence, chat_id, tool_call_id, output=str(exc), is_error=True
            )
            raise
        except CoderError:
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise CoderToolError(self.name, tool_call_id, reason) from exc

    async def same_step_call(
        self, b: LedgerBinding, chat_id: str, digest: str, *, exclude: str
    ) -> LedgerEntry | None:
        """An earlier call of this tool in this step with identical arguments.

        Of several, a ``done`` one (its output is the effect's), else the *first*: a
        later same-step call only ever re-drives an earlier one under the earlier's
        key, so the first call's key is the only one the effect was ever applied
        under; re-driving a later one's key could apply the effect a second time.
        """
        entries = await b.store.list_tools(b.tenant, chat_id)
        matches = [
            e
            for e in entries
            if e.tool_name == self.name
            and e.marker == b.marker
            and e.args_digest == digest
            and e.tool_call_id != exclude
        ]
        done = [e for e in matches if e.state == "done"]
        chosen = done or matches
        return chosen[0] if chosen else None

    async def redrive(self, b: LedgerBinding, entry: LedgerEntry, args: BaseModel) -> Any:
        """Run a ``committing`` entry's effect again under its own key, then record it done."""
        key = entry.idempotency_key
        output = await self._effect(b, entry.chat_id, entry.tool_call_id, args, key)
        await b.store.complete_tool(b.fence, entry.chat_id, entry.tool_call_id, output=output)
        return output


def durable_tool(function: F) -> DurableTool:
    """Make an async function a crash-safe client tool.

    The function's typed parameters become the tool's arguments; give it an
    ``idempotency_key: str`` parameter and pass that key to the external system,
    so a re-driven call is a no-op there::

        @durable_tool
        async def charge_card(amount_cents: int, idempotency_key: str) -> str:
            \"\"\"Charge the customer's card.\"\"\"
            receipt = await payments.charge(amount_cents, idempotency_key=idempotency_key)
            return f"charged: receipt {receipt}"
    """
    return DurableTool(function)
