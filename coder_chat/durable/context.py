"""What one durable step works with: the client, the store, the run's fence, its tools."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from ..client.rest import ChatClient
from ..client.tools import ClientTool, ToolFunction, client_tool, structured_output_tool
from ..errors import CoderConfigError
from ..protocol.transcript import STRUCTURED_OUTPUT
from .markers import step_marker
from .records import Fence, RecoveryReason
from .store import DurableStore
from .tools import DurableTool, LedgerBinding

logger = logging.getLogger("coder_chat.durable")


@dataclass
class DurableOptions:
    """Every timer of the durable layer, in seconds; defaults follow the reference."""

    #: Bounds each segment of a turn (REST, stream and redial backoff together).
    request_timeout: float = 300.0
    #: Bounds a whole step's turn (``None``: no bound beyond the segments').
    step_deadline: float | None = 600.0
    #: Bounds recovery's interrupt (the reference's 15 s).
    interrupt_timeout: float = 15.0
    #: The settle poll's turn-scale budget: a reconciled pause revives a whole run.
    settle_timeout: float = 600.0
    poll_interval: float = 1.0
    #: How long a journaled send may still land after it was written. ``None``
    #: means ``request_timeout``, the conservative horizon of the reference.
    commit_horizon: float | None = None
    #: Redial and lost-event timers handed to the session.
    redial_initial: float = 1.0
    action_grace: float = 2.0
    archive_retry_interval: float = 1.0
    archive_window: float = 15.0

    @property
    def horizon(self) -> float:
        return self.request_timeout if self.commit_horizon is None else self.commit_horizon


@dataclass
class StepTools:
    """A step's client tools: durable ones, plain ones (allowed explicitly), structured output."""

    durable: dict[str, DurableTool] = field(default_factory=dict)
    plain: dict[str, ClientTool] = field(default_factory=dict)
    structured: ClientTool | None = None

    @classmethod
    def build(
        cls,
        tools: Sequence[DurableTool | ToolFunction | ClientTool],
        *,
        allow_plain: bool = False,
        output_type: type[BaseModel] | None = None,
    ) -> StepTools:
        built = cls(structured=structured_output_tool(output_type) if output_type else None)
        for tool in tools:
            if isinstance(tool, DurableTool):
                built.durable[tool.name] = tool
                continue
            if not allow_plain:
                name = getattr(tool, "name", getattr(tool, "__name__", repr(tool)))
                raise CoderConfigError(
                    f"tool {name} is not a durable tool: decorate it with @durable_tool, "
                    "or allow plain tools explicitly (their effects may repeat after a crash)"
                )
            plain = client_tool(tool)
            built.plain[plain.name] = plain
        return built

    @property
    def names(self) -> frozenset[str]:
        names = set(self.durable) | set(self.plain)
        if self.structured is not None:
            names.add(STRUCTURED_OUTPUT)
        return frozenset(names)

    def for_session(self, binding: LedgerBinding) -> list[ClientTool]:
        """Tools as a session runs them: durable ones wrapped in the ledger."""
        return [t.bind(binding) for t in self.durable.values()] + list(self.plain.values())


@dataclass
class StepContext:
    """One step of one workflow run."""

    client: ChatClient
    store: DurableStore
    fence: Fence
    workflow_id: str
    step: int
    tools: StepTools
    options: DurableOptions = field(default_factory=DurableOptions)
    #: Where recovery verdicts are reported (the task-run log, in Prefect).
    report: Callable[[str], None] = logger.info
    #: Nothing can have acted for this step before: the workflow's first run (epoch 1),
    #: the step's first try. An empty checkpoint then needs no search for an orphan.
    first_try: bool = False

    @property
    def tenant(self) -> str:
        return self.fence.tenant

    @property
    def marker(self) -> str:
        return step_marker(self.workflow_id, self.step)

    @property
    def binding(self) -> LedgerBinding:
        return LedgerBinding(self.store, self.fence, self.marker)


#: Why a recovery pass runs; a timeout or an abort already fired an interrupt.
PINS_CUT_SHORT: frozenset[RecoveryReason] = frozenset({"timeout", "abort"})
