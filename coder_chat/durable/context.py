"""What one durable step works with: the client, the store, the run's fence, its tools."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from ..client.options import ChatOptions
from ..client.rest import ChatClient
from ..client.tools import ClientTool, ToolFunction, client_tool, structured_output_tool
from ..errors import CoderConfigError
from ..protocol.transcript import STRUCTURED_OUTPUT
from .budget import Budget
from .fence import FenceGuard
from .markers import step_marker
from .records import Fence, RecoveryReason
from .store import DurableStore
from .tools import DurableTool, LedgerBinding

logger = logging.getLogger("coder_chat.durable")


@dataclass(frozen=True)
class DurableOptions:
    """What a workflow's steps run with: its chat's options, handed to every session
    unchanged, and the durable layer's own timers, in seconds (defaults follow the
    reference). A flow builds it once (``WorkflowSettings.options()``)."""

    #: How the chat is made and its turns run (system prompt, model, timeouts, ...).
    chat: ChatOptions = field(default_factory=ChatOptions)
    #: The deployment the chat is labelled with (the sweep's filter).
    deployment: str = "local"
    #: Declare the ``structured_output`` tool at creation, so any later step may ask for a
    #: structured answer (each step validates its own schema).
    structured_output: bool = False
    #: Bounds a whole step's turn (``None``: no bound beyond the segments').
    step_deadline: float | None = 600.0
    #: How far Coder's clock may lag this machine's. An interrupt whose outcome is
    #: unknown did not cut an attempt whose messages Coder stamped earlier than the
    #: interrupt was sent, by more than this.
    clock_skew: float = 5.0
    #: The settle poll's turn-scale budget: a reconciled pause revives a whole run.
    settle_timeout: float = 600.0
    poll_interval: float = 1.0
    #: How long a journaled send may still land after it was written. ``None``
    #: means the chat's ``request_timeout``, the conservative horizon of the reference.
    commit_horizon: float | None = None
    #: Tell each turn's story (prompt, tool calls and outcomes, reconnects, reply) to the
    #: step's report as it happens.
    story: bool = False
    #: What the workflow may spend over all its runs; past a limit it takes no turn.
    budget: Budget = field(default_factory=Budget)

    @property
    def horizon(self) -> float:
        return self.chat.request_timeout if self.commit_horizon is None else self.commit_horizon


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
    """One step of one workflow run. The run's fence is held once, by its guard."""

    client: ChatClient
    #: The run's fence and store, checked before each action on Coder: this run still
    #: holds its epoch.
    guard: FenceGuard
    workflow_id: str
    step: int
    tools: StepTools
    options: DurableOptions = field(default_factory=DurableOptions)
    #: Where recovery verdicts are reported (the task-run log, in Prefect).
    report: Callable[[str], None] = logger.info
    #: Nothing can have acted for this step before: the workflow's first run (epoch 1),
    #: the step's first try. An empty checkpoint then needs no search for an orphan.
    first_try: bool = False
    #: How report lines name the step (``Step 2``; a flow run of many workflows names
    #: the workflow too).
    title: str = ""
    #: Where the turn's story is told (``options.story``); ``None``: to ``report``.
    tell: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        # A call in the older shape (client, store, fence, ...) would shift every field and
        # fail far from here: refuse it now, naming the way to build one from a fence.
        if not isinstance(self.guard, FenceGuard):
            raise TypeError(
                "StepContext takes a FenceGuard after the client; to start from a store and "
                "a fence, use StepContext.fenced(client, store, fence, workflow_id, step, tools)"
            )

    @classmethod
    def fenced(
        cls,
        client: ChatClient,
        store: DurableStore,
        fence: Fence,
        workflow_id: str,
        step: int,
        tools: StepTools,
        options: DurableOptions | None = None,
        *,
        report: Callable[[str], None] = logger.info,
        first_try: bool = False,
    ) -> StepContext:
        """A step of the run that holds ``fence``, guarded by a guard of its own."""
        guard = FenceGuard(store, fence)
        options = options or DurableOptions()
        return cls(client, guard, workflow_id, step, tools, options, report, first_try)

    @property
    def name(self) -> str:
        return self.title or f"Step {self.step}"

    async def may_act(self, action: str) -> None:
        """Raise :class:`~.store.FencedOut` when a newer run took the workflow."""
        await self.guard(action)

    @property
    def tenant(self) -> str:
        return self.fence.tenant

    @property
    def store(self) -> DurableStore:
        """The run's store: its guard's, which checks the fence against it."""
        return self.guard.store

    @property
    def fence(self) -> Fence:
        """The epoch this run holds: its guard's, the one place it is kept."""
        return self.guard.fence

    @property
    def marker(self) -> str:
        return step_marker(self.workflow_id, self.step)

    @property
    def binding(self) -> LedgerBinding:
        return LedgerBinding(self.store, self.fence, self.marker)


#: Why a recovery pass runs; a timeout or an abort already fired an interrupt.
PINS_CUT_SHORT: frozenset[RecoveryReason] = frozenset({"timeout", "abort"})
