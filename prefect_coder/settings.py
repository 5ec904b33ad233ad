"""``WorkflowSettings``: how a durable chat's steps run, as one parameter of the run form;
``TaskSettings``: how our tasks retry, the one configuration every task is built from."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coder_chat.client.options import ChatOptions
from coder_chat.durable.budget import Budget
from coder_chat.durable.context import DurableOptions


class TaskSettings(BaseModel):
    """How a task that failed transiently (Coder's 5xx or 429, the store restarting, a
    segment's timeout) is tried again. Every task of ours is built with the defaults. A
    workflow given others (``WorkflowSettings.tasks``) runs its turns with them, and tries
    again on the same schedule what it does between its turns (its begin and end on the
    store, say); any task takes them with Prefect's ``with_options`` (:meth:`task_options`).
    A failure that is not transient is never retried."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    retries: int = Field(
        default=3,
        ge=0,
        title="Retries",
        description="How many times a task that failed transiently is tried again.",
    )
    retry_delay_seconds: list[float] = Field(
        default_factory=lambda: [1.0, 5.0, 15.0],
        min_length=1,
        title="Retry delays (seconds)",
        description="The wait before each retry; the last one serves for any retry after it.",
    )

    def delays(self) -> list[float]:
        """One delay per retry: the list as given, its last delay repeated as needed."""
        given = self.retry_delay_seconds
        return [given[min(i, len(given) - 1)] for i in range(self.retries)]

    def task_options(self) -> dict[str, Any]:
        """These settings as keyword arguments of Prefect's ``Task.with_options``."""
        return {"retries": self.retries, "retry_delay_seconds": self.delays()}


def _limit(title: str, description: str) -> Any:
    """A budget's field: a positive number, empty (no limit) unless set."""
    return Field(default=None, gt=0, title=title, description=f"{description} Empty: no limit.")


class WorkflowSettings(BaseModel):
    """The chat's setup and each step's limits; every field has a default that serves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system_prompt: str = Field(default="", title="System prompt", description="Empty: Coder's.")
    model: str = Field(
        default="",
        title="Model",
        description="A model config id, provider:model, or display name (empty: Coder's default).",
    )
    workspace_id: str = Field(
        default="", title="Workspace ID", description="A Coder workspace to bind the chat to."
    )
    mcp_server_ids: list[str] = Field(
        default_factory=list, title="MCP server IDs", description="MCP servers the chat may use."
    )
    allow_plain_tools: bool = Field(
        default=False,
        title="Allow plain tools",
        description="Accept plain async functions as tools; their effects may run again after a crash.",
    )
    request_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        title="Request timeout (seconds)",
        description="How long each segment of a turn may take.",
    )
    step_deadline_seconds: float = Field(
        default=600.0,
        gt=0,
        title="Step deadline (seconds)",
        description="How long a whole step may take; a run a crash left going gets as long to finish.",
    )
    heartbeat_seconds: float = Field(
        default=30.0,
        gt=0,
        title="Heartbeat interval (seconds)",
        description="How often the run tells the orphan sweep it is alive.",
    )
    archive_at_end: bool = Field(
        default=True,
        title="Archive at end",
        description="Archive the chat when the workflow ends or definitively fails.",
    )
    pulse_seconds: float = Field(
        default=5.0,
        ge=0,
        title="Pulse interval (seconds)",
        description=(
            "How often the run tells Prefect it is alive, so that a run whose host died is "
            "relaunched in seconds (the orphan sweep's silent trigger); 0: never."
        ),
    )
    tell_turns: bool = Field(
        default=True,
        title="Tell each turn's story",
        description=(
            "Log each turn as it happens in its task run: the prompt, each tool the agent "
            "calls and its outcome, reconnects, the reply (shortened). Off for large fleets."
        ),
    )
    max_tokens: int | None = _limit(
        "Token budget",
        "Tokens the workflow's turns may use in all, over every run (input, cached or not, and "
        "output). Once reached it takes no further turn: it ends Over budget, its chat archived.",
    )
    max_cost_micros: int | None = _limit(
        "Cost budget (micros)",
        "What its turns may cost in all, in millionths of a dollar, where Coder reports cost.",
    )
    max_turns: int | None = _limit("Turn budget", "How many turns it may take in all.")

    tasks: TaskSettings = Field(
        default_factory=TaskSettings,
        title="Task retries",
        description=(
            "How each turn's task, and the workflow's work between its turns (its begin, "
            "its end, a person's answer saved), is tried again after a transient failure."
        ),
    )

    def options(self, deployment: str = "local") -> DurableOptions:
        """What the workflow's steps run with, built once: the chat's options (handed to
        every turn unchanged) and the durable layer's limits."""
        chat = ChatOptions(
            system_prompt=self.system_prompt or None,
            model=self.model or None,
            workspace_id=self.workspace_id or None,
            mcp_server_ids=tuple(self.mcp_server_ids),
            request_timeout=self.request_timeout_seconds,
        )
        return DurableOptions(
            chat=chat,
            deployment=deployment,
            structured_output=True,
            step_deadline=self.step_deadline_seconds,
            settle_timeout=self.step_deadline_seconds,
            story=self.tell_turns,
            budget=Budget(self.max_tokens, self.max_cost_micros, self.max_turns),
        )
