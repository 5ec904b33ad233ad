"""What one schedule is: its workflows' steps, its fault knobs, its kills, its variant.

Plain frozen records, derived from ``(seed, index, variant)`` by :mod:`.draw`, and
able to describe themselves in one line so a violation can be replayed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from .schemas import VERDICT

StepKind = Literal["plain", "tool", "parallel", "deltas", "sleep", "json"]
Variant = Literal["sqlite", "postgres", "second-machine", "concurrent", "refund"]
VARIANTS: tuple[Variant, ...] = ("sqlite", "postgres", "second-machine", "concurrent", "refund")
KillKind = Literal["moment", "after-prompt", "in-tool", "held-send", "paused"]
Phase = Literal["before", "after"]
PersonKind = Literal["changed-prompt", "cancel-resume"]
PERSON_KINDS: tuple[PersonKind, ...] = ("changed-prompt", "cancel-resume")


@dataclass(frozen=True)
class Step:
    """One step: its prompt (without the marker the durable layer adds) and what it calls."""

    kind: StepKind
    prompt: str
    #: The amounts the step charges, one durable ``charge_card`` call each.
    amounts: tuple[int, ...] = ()
    #: What a structured step files through ``structured_output``.
    structured: dict[str, Any] | None = None
    #: The structured answer's model as an import path (default: the campaign's Verdict).
    model: str | None = None
    #: How the tool's result names an applied charge: ``<verb> <amount> cents: receipt <r>``.
    verb: str = "charged"

    @property
    def schema(self) -> str | None:
        return (self.model or VERDICT) if self.kind == "json" else None

    def receipt_line(self, amount: int, receipt: str) -> str:
        return f"{self.verb} {amount} cents: receipt {receipt}"

    def describe(self) -> str:
        if self.amounts:
            return f"{self.kind}({'+'.join(map(str, self.amounts))})"
        if self.kind in ("deltas", "sleep"):
            return f"{self.kind}({self.prompt.split()[-1]})"
        return self.kind


@dataclass(frozen=True)
class Knob:
    """A fault knob armed over the simulator's admin routes once ``after_prompts``
    prompts of the first workflow have landed (0: before anything runs)."""

    kind: str
    body: tuple[tuple[str, Any], ...]
    after_prompts: int = 0

    @property
    def payload(self) -> dict[str, Any]:
        return dict(self.body)

    def describe(self) -> str:
        args = " ".join(f"{k}={v}" for k, v in self.body)
        return f"{self.kind}({args})@{self.after_prompts}"


@dataclass(frozen=True)
class Kill:
    """When to SIGKILL one run of a workflow.

    - ``moment``: ``delay`` seconds after the run was let go;
    - ``after-prompt``: ``delay`` seconds after the ``nth`` prompt that lands during the run;
    - ``in-tool``: while the run's ``nth`` charge is held ``phase`` its effect;
    - ``held-send``: while the run's send after its ``nth`` landed prompt is held
      before it commits; released only once the next run resubmitted the step (or
      gave it time to), so it lands late: the one window the contract leaves open;
    - ``paused``: while the run's flow run is paused for a person (who has not
      answered it yet, and never will: the next run asks again).
    """

    kind: KillKind
    nth: int = 1
    delay: float = 0.0
    phase: Phase = "before"

    def describe(self) -> str:
        if self.kind == "moment":
            return f"moment+{self.delay:.2f}s"
        if self.kind == "after-prompt":
            return f"after-prompt#{self.nth}+{self.delay:.2f}s"
        if self.kind == "in-tool":
            return f"in-tool#{self.nth}-{self.phase}"
        if self.kind == "paused":
            return "paused"
        return f"held-send#{self.nth}"


@dataclass(frozen=True)
class Person:
    """What a person does to a workflow once its ``after_run``-th run was killed, before
    the next planned run (they are inputs, not faults: DESIGN.md points 11 and 14):

    - ``changed-prompt``: runs the workflow again with its first step's prompt changed
      (:data:`CHANGED`), which must be refused (``PromptChanged``), leaving the store's rows
      as they were and sending Coder nothing; the planned runs then go on;
    - ``cancel-resume``: cancels the workflow (``prefect_coder.operations.cancel_workflow``),
      which must store it cancelled with its chats archived and quiet; the next planned
      run, the same workflow id and prompts, is the resume that carries it on.
    """

    kind: PersonKind
    after_run: int

    def describe(self) -> str:
        what = "changed prompt" if self.kind == "changed-prompt" else "cancel+resume"
        return f"{what} after run {self.after_run}"


#: How a person rewords the first step's prompt for a ``changed-prompt`` run.
CHANGED = "(reworded by a person) "


@dataclass(frozen=True, order=True)
class PgRestart:
    """Restart the Postgres server ``delay`` seconds after the first workflow's ``run``-th
    run was let go (a run starts with ``begin_workflow``, a store write without retries)."""

    run: int
    delay: float

    def describe(self) -> str:
        return f"run{self.run}+{self.delay:.2f}s"


@dataclass(frozen=True)
class RefundCase:
    """One run of the README's ``refund_order``: what the model plans, what the person says."""

    order_id: str
    amount_cents: int
    approval_above_cents: int
    #: The person's answer, the same every time a run asks (unused below the limit).
    approved: bool
    complaint: str
    #: Seconds the person takes to answer a pause.
    answer_after: float = 0.0

    @property
    def workflow_id(self) -> str:
        return f"refund-{self.order_id}"

    @property
    def asks(self) -> bool:
        """Whether a person is asked: the planned amount is above the limit."""
        return self.amount_cents > self.approval_above_cents

    @property
    def refunds(self) -> bool:
        """Whether the flow takes the refund branch (no person asked, or approved)."""
        return not self.asks or self.approved

    def describe(self) -> str:
        side = "above" if self.asks else "below"
        answer = ("approved" if self.approved else "declined") if self.asks else "not asked"
        wait = f" after {self.answer_after:.1f}s" if self.asks else ""
        return f"refund {self.amount_cents} ({side} {self.approval_above_cents}, {answer}{wait})"


@dataclass(frozen=True)
class WorkflowPlan:
    workflow_id: str
    steps: tuple[Step, ...]
    #: Kill ``i`` applies to run ``i + 1``; the runs after the last kill go to the end.
    kills: tuple[Kill, ...]
    #: Set when the workflow is the README's ``refund_order`` flow, not ``durable_chat``.
    refund: RefundCase | None = None
    #: What a person does between two of its runs, if anything.
    person: Person | None = None

    @property
    def prompts(self) -> list[str]:
        return [s.prompt for s in self.steps]

    @property
    def output_schemas(self) -> list[str] | None:
        """Per step, the schema's import path or ``""`` for text; ``None`` when all are text."""
        schemas = [s.schema or "" for s in self.steps]
        return schemas if any(schemas) else None

    @property
    def changed_prompts(self) -> list[str]:
        """The prompts of a person's ``changed-prompt`` run: the first one reworded."""
        first, *rest = self.prompts
        return [CHANGED + first, *rest]

    @property
    def charges(self) -> int:
        return sum(len(s.amounts) for s in self.steps)

    def describe(self) -> str:
        steps = ", ".join(s.describe() for s in self.steps)
        kills = "; ".join(k.describe() for k in self.kills)
        flow = f" {self.refund.describe()}" if self.refund else ""
        person = f" person [{self.person.describe()}]" if self.person else ""
        return f"{self.workflow_id}:{flow} steps [{steps}] kills [{kills}]{person}"


@dataclass(frozen=True)
class Schedule:
    seed: int
    index: int
    variant: Variant
    workflows: tuple[WorkflowPlan, ...]
    knobs: tuple[Knob, ...] = ()
    pg_restarts: tuple[PgRestart, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.seed}/{self.index}"

    def replay(self) -> str:
        return (
            f"python -m tests.campaign --seed {self.seed} --only {self.index} "
            f"--variant {self.variant}"
        )

    def describe(self) -> str:
        parts = [w.describe() for w in self.workflows]
        parts.append("knobs [" + ", ".join(k.describe() for k in self.knobs) + "]")
        if self.pg_restarts:
            parts.append("pg restarts [" + ", ".join(r.describe() for r in self.pg_restarts) + "]")
        return " | ".join(parts)


def prompt_json(value: Any) -> str:
    """JSON as the scripted model's directives take it (compact, stable)."""
    return json.dumps(value, separators=(", ", ": "), sort_keys=True)
