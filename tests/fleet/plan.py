"""What one fleet schedule is: its workflows, and the faults that hit hosts and links.

Plain frozen records, derived from ``(seed, index)`` by :mod:`.draw` (or written by
hand, as the CI scenario is), each able to describe itself in one line.

A fault starts when its ``start`` moment comes and is undone (a link healed, a
killed host's worker started again) when its ``end`` comes. A moment is a time
after the schedule began (or, for an end, after the fault began), or an event a
workflow reaches: its n-th step finished, or its n-th epoch taken (a successor
run has begun). A fault aimed at ``running:<workflow>`` hits whichever worker
host runs that workflow when the fault starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tests.lab.steps import Step

FaultKind = Literal[
    "kill-host",  # SIGKILL every process of a worker host; its worker starts again at the end
    "cut-host",  # the host's link down, then up
    "cut-store",  # the host cut off from the store host alone
    "cut-coder",  # the host cut off from the Coder host alone
    "shape-coder",  # the host's link to Coder slowed: queueing delay, tail drops, fixed delay
    "restart-store",  # the store's PostgreSQL stopped at once and started again
    "restart-prefect",  # Prefect's server killed, its PostgreSQL restarted, the server started
]
HOST_FAULTS: tuple[FaultKind, ...] = (
    "kill-host",
    "cut-host",
    "cut-store",
    "cut-coder",
    "shape-coder",
)
MomentKind = Literal["time", "step", "epoch"]
PersonKind = Literal["cancel-resume", "changed-prompt"]
PERSON_KINDS: tuple[PersonKind, ...] = ("cancel-resume", "changed-prompt")
#: How a person rewords a workflow's first prompt for a ``changed-prompt`` run.
CHANGED = "(reworded by a person) "
CutHow = Literal["silent", "refused"]


@dataclass(frozen=True)
class Moment:
    kind: MomentKind
    #: Seconds (for ``time``), or after this many seconds once the event is reached.
    delay: float = 0.0
    workflow_id: str = ""
    #: The step finished, or the epoch taken, that the moment waits for.
    number: int = 0

    def describe(self) -> str:
        if self.kind == "time":
            return f"+{self.delay:.1f}s"
        what = "step" if self.kind == "step" else "epoch"
        return f"{self.workflow_id} {what} {self.number}+{self.delay:.1f}s"


@dataclass(frozen=True)
class Shape:
    rate_kbit: int
    queue_packets: int
    delay: float

    def describe(self) -> str:
        return f"{self.rate_kbit}kbit/q{self.queue_packets}/+{self.delay * 1000:.0f}ms"


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    start: Moment
    #: A host name, or ``running:<workflow id>``; empty for the store and Prefect faults.
    target: str = ""
    end: Moment | None = None
    how: CutHow = "silent"
    shape: Shape | None = None

    def describe(self) -> str:
        target = f" {self.target}" if self.target else ""
        how = f" {self.how}" if self.kind in ("cut-store", "cut-coder") else ""
        shape = f" {self.shape.describe()}" if self.shape else ""
        end = f" until {self.end.describe()}" if self.end else ""
        return f"{self.kind}{target}{how}{shape} at {self.start.describe()}{end}"


@dataclass(frozen=True)
class Person:
    """What a person does to a workflow while it runs, at a moment of its own (a step of
    the workflow finished, and a delay):

    - ``cancel-resume``: cancels the flow run holding the workflow through Prefect's
      API, as the UI's Cancel button does; once the store says ``cancelled``, resumes
      it as ``prefect-coder workflows resume`` does;
    - ``changed-prompt``: runs the workflow again from its deployment, on ``queue``,
      with its first prompt reworded: a run to be refused, taking and sending nothing.
    """

    kind: PersonKind
    at: Moment
    queue: str = "default"

    def describe(self) -> str:
        where = f" on {self.queue}" if self.kind == "changed-prompt" else ""
        return f"{self.kind}{where} at {self.at.describe()}"


@dataclass(frozen=True)
class FleetWorkflow:
    workflow_id: str
    steps: tuple[Step, ...]
    #: The work queue it is launched on: a worker host's own, or ``default``.
    queue: str = "default"
    launch_at: float = 0.0
    person: Person | None = None

    @property
    def prompts(self) -> list[str]:
        return [s.prompt for s in self.steps]

    @property
    def changed_prompts(self) -> list[str]:
        """The prompts of a person's ``changed-prompt`` run: the first one reworded."""
        return [CHANGED + self.steps[0].prompt, *self.prompts[1:]]

    def describe(self) -> str:
        steps = ", ".join(s.describe() for s in self.steps)
        person = f" person [{self.person.describe()}]" if self.person else ""
        return f"{self.workflow_id}@{self.queue}+{self.launch_at:.0f}s [{steps}]{person}"


@dataclass(frozen=True)
class FleetSchedule:
    seed: int
    index: int
    workflows: tuple[FleetWorkflow, ...]
    faults: tuple[Fault, ...]

    @property
    def name(self) -> str:
        return f"{self.seed}/{self.index}"

    def replay(self) -> str:
        return f"python -m tests.fleet --seed {self.seed} --only {self.index}"

    def describe(self) -> str:
        workflows = "; ".join(w.describe() for w in self.workflows)
        faults = "; ".join(f.describe() for f in self.faults)
        return f"workflows [{workflows}] | faults [{faults}]"
