"""``DurableChat``: durable Coder turns inside your own Prefect flow.

::

    @flow
    async def refund(order_id: str) -> None:
        async with DurableChat(f"refund-{order_id}", tools=[issue_refund]) as chat:
            plan = await chat.turn(f"Plan the refund of order {order_id}", output=RefundPlan)
            if plan.output.amount_cents > 10_000:
                approval = await chat.wait_for_input(Approval)
            await chat.turn("Issue the refund")

The k-th turn of a workflow is its step k. Each turn is one Prefect task
(``run_turn``) that runs, recovers or safely resubmits the step; a finished step is
never sent again. A re-run of the flow, on any machine, replays its finished turns
from the store, so the code between turns runs again on the same answers and must
decide the same way; a turn whose prompt differs from what its step ran is refused
(:class:`~coder_chat.durable.records.PromptChanged`), and nothing is changed. A prompt
changes under running workflows behind :meth:`DurableChat.patched`.

Entering begins the workflow and leaving ends it, through the run's hold on it
(``prefect_coder._run.hold``): its next fencing epoch taken (so a superseded run can
never act again), its run named and kept alive; at the end its chat archived and the
workflow stored finished, or, after a definitive failure, archived and marked failed. A
crash ends nothing: the sweep relaunches the run, and a pause or a suspension ends
nothing either (the run resumes where it was).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Generic, TypeVar, overload

from prefect.flow_runs import apause_flow_run, asuspend_flow_run
from pydantic import BaseModel

from coder_chat import CoderConfigError
from coder_chat.durable.records import StepRecord
from coder_chat.durable.step import StepResult, check_same_prompt
from coder_chat.protocol.usage import UsageTotals
from prefect_coder._run.hold import Hold, log_here
from prefect_coder._run.runtime import Ledger, checked_blocks
from prefect_coder._run.story import step_line, workflow_usage
from prefect_coder._run.task_policy import tuned
from prefect_coder._run.workflow import WorkflowRun, record_cached_step
from prefect_coder.blocks import CoderCredentials
from prefect_coder.exceptions import StoreLost, Superseded, WorkflowCancelled, WorkflowFinished
from prefect_coder.imports import ToolLike
from prefect_coder.settings import WorkflowSettings
from prefect_coder.tasks.turns import run_turn

M = TypeVar("M", bound=BaseModel)
A = TypeVar("A", bound=BaseModel)

#: Frozen, so one instance serves every chat that is given no settings.
DEFAULT_SETTINGS = WorkflowSettings()


class Structured(StepResult, Generic[M]):
    """A turn's result whose ``output`` is the structured answer, validated as ``M``."""

    output: M


class DurableChat:
    """One durable workflow on one Coder chat, turn by turn, inside a Prefect flow.

    Args:
        workflow_id: Your name for the workflow; run the flow again with the same id to
            resume it after a crash, on any machine.
        credentials: Saved Coder credentials (none: ``CODER_URL``, ``CODER_SESSION_TOKEN``
            and ``CODER_ORG_ID`` from the worker's environment).
        ledger: Where progress is stored (none: the embedded SQLite store; workers on
            several machines need a ``PostgresLedger``).
        tools: The chat's client tools: ``@durable_tool`` functions (their effects run at
            most once), plain async functions if ``settings.allow_plain_tools``, or
            either as an import path (``module:function``). Coder declares a chat's
            tools when it is created, so they are given here, for every turn.
        settings: The chat's setup and each step's time limits.
        expected_turns: How many turns the flow means to take, when it knows: runs and
            task runs say ``step 2 of 3``, and the progress artifact shows a share.
        owns_run: The workflow is its flow run's only one: the run is named after it,
            has its progress and transcript artifacts, and marks the run it replaces
            superseded. A flow run that holds many workflows passes ``False`` and does
            those itself; every line then names the workflow, and the workflow's end is
            not logged: :meth:`summary` says it, for the flow to put where it shows
            each workflow (``durable_chats``: its progress artifact).
    """

    def __init__(
        self,
        workflow_id: str,
        *,
        credentials: CoderCredentials | None = None,
        ledger: Ledger | None = None,
        tools: Sequence[ToolLike] = (),
        settings: WorkflowSettings | None = None,
        expected_turns: int | None = None,
        owns_run: bool = True,
    ) -> None:
        if not workflow_id:
            raise CoderConfigError("workflow_id must not be empty")
        self.workflow_id = workflow_id
        # A block loaded without ``await`` in an async flow is refused here, by name.
        credentials, ledger = checked_blocks(credentials, ledger)
        self.settings = settings or DEFAULT_SETTINGS
        self.owns_run = owns_run
        #: The turn task, retried as the workflow's settings say: made once, not per turn.
        self._turn_task = tuned(run_turn, self.settings.tasks)
        self._hold = Hold(
            workflow_id,
            credentials=credentials,
            ledger=ledger,
            tools=tools,
            settings=self.settings,
            expected_turns=expected_turns,
            owns_run=owns_run,
        )
        #: What the workflow was told between turns, kept in the store, and how much of it
        #: this run has used (the k-th wait is answered by the k-th input).
        self._inputs: list[object] = []
        self._inputs_used = 0
        #: Each patch the workflow met and what it decided (``patched``); the names of the
        #: decisions not yet in the store, written before the next turn sends.
        self._patches: dict[str, bool] = {}
        self._unsaved_patches: set[str] = set()

    def __repr__(self) -> str:
        return f"DurableChat({self.workflow_id!r}, steps done={len(self.results)})"

    # -- what a flow reads --------------------------------------------------------------
    @property
    def results(self) -> list[StepResult]:
        """Each turn's result so far, in step order (replayed ones first)."""
        return self._hold.results

    @property
    def run(self) -> WorkflowRun:
        return self._hold.run

    @property
    def previous_run(self) -> str | None:
        """The flow run that held the workflow before this one, while it was running."""
        return self._hold.previous_run

    @property
    def usage(self) -> UsageTotals:
        """What the workflow used so far: its steps' usage, and, once it finished here,
        what its chat ran after the last of them."""
        return workflow_usage(self._hold.results, self._hold.after_steps)

    def summary(self) -> str:
        """``3 step(s), 3 ran; it used …; its chat … is archived``: how the workflow ended here."""
        return self._hold.summary()

    # -- begin and end ------------------------------------------------------------------
    async def __aenter__(self) -> DurableChat:
        await self._hold.begin()
        before = self._hold.held().before
        self._inputs = list(before.inputs) if before else []
        self._patches = dict(before.patches) if before else {}
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._hold.end(exc)

    # -- turns --------------------------------------------------------------------------
    @overload
    async def turn(self, prompt: str) -> StepResult: ...

    @overload
    async def turn(self, prompt: str, *, output: type[M]) -> Structured[M]: ...

    @overload
    async def turn(self, prompt: str, *, output: type[BaseModel] | None) -> StepResult: ...

    async def turn(self, prompt: str, *, output: type[BaseModel] | None = None) -> StepResult:
        """Take the workflow's next step: ``prompt`` on its chat, once.

        A step that finished in an earlier run comes back from the store, without a
        request; with ``output``, the answer is a structured one, validated as that model
        (``result.output``).
        """
        began = self._hold.held()
        step = len(self.results) + 1
        stored = began.stored.get(step)
        if stored is not None:
            result = self._replayed(stored, prompt)
        else:
            if began.replay:
                await self._hold.go_on(prompt)
            self._check_budget(step)
            await self._save_patches()
            result = await self._run_turn(step, prompt, output)
        await self._hold.record(prompt, result)
        if output is None:
            return result
        return Structured[output].model_validate({**result.model_dump(), "output": result.output})  # type: ignore[valid-type]

    async def wait_for_input(
        self, input_type: type[A], *, timeout: int = 3600, suspend: bool = False
    ) -> A:
        """Wait between turns for a person's answer, once: it is kept with the workflow.

        A run that goes again (relaunched after a crash, on any worker) is given the
        answer it had, without asking again, so it decides the same. ``input_type`` is a
        pydantic model (or Prefect ``RunInput``) the UI shows as a form when the run
        pauses. ``suspend`` lets the run's process exit while it waits (the run needs a
        deployment; when resumed, a worker runs the flow again, its finished turns from
        the store); otherwise the process waits, its heartbeat going on.
        """
        began = self._hold.held("waiting for input")
        number = self._inputs_used + 1
        if number <= len(self._inputs):
            self._inputs_used = number
            log_here().info(
                f"{self._input_title(number)}: answered in an earlier run; not asked again."
            )
            return input_type.model_validate(self._inputs[number - 1])
        if began.replay:
            await self._hold.go_on()
        log_here().info(f"{self._input_title(number)}: waiting for a person's answer.")
        what = f"a person's answer: {input_type.__name__}, input {number}"
        async with self._hold.waiting(what, suspend=suspend):
            if suspend:
                answer = await asuspend_flow_run(wait_for_input=input_type, timeout=timeout)
            else:
                answer = await apause_flow_run(wait_for_input=input_type, timeout=timeout)
        self._inputs.append(answer.model_dump(mode="json"))
        run, told = self.run, list(self._inputs)
        await run.retried(lambda: run.runtime.store.save_inputs(run.fence, told))
        self._inputs_used = number
        return answer

    def patched(self, name: str) -> bool:
        """Whether this workflow takes the code path of patch ``name``, decided once.

        Change a prompt under running workflows behind a patch::

            if chat.patched("shorter-plan"):
                plan = await chat.turn("Plan it in three lines")
            else:
                plan = await chat.turn("Plan it")

        True for a workflow that reaches this point with the patch deployed; False for
        one that had already passed it (its next step was sent before), so that its
        replay takes the path it took. The decision is kept in the store with the
        workflow, so every later run, on any machine, decides the same. Name each patch
        once per workflow; a patch stays in the code while workflows that passed it
        without it may still run.
        """
        began = self._hold.held("asking for patches")
        decided = self._patches.get(name)
        if decided is None:
            decided = len(self.results) + 1 > began.last_sent_step
            self._patches[name] = decided
            self._unsaved_patches.add(name)
        return decided

    async def _save_patches(self) -> None:
        """Write this run's patch decisions before its next send (a run that stops before
        sending anything decides the same again)."""
        if not self._unsaved_patches:
            return
        run, patches = self.run, dict(self._patches)
        await run.retried(lambda: run.runtime.store.save_patches(run.fence, patches))
        self._unsaved_patches.clear()

    def _input_title(self, number: int) -> str:
        name = f"input {number}"
        return f"{self.workflow_id}, {name}" if not self.owns_run else name[:1].upper() + name[1:]

    def _check_budget(self, step: int) -> None:
        """Stop before a step the budget does not allow, from what this run's results say
        the steps before it used, with no task run for it (a person would read a failed
        one). The step's task checks the same against the store, so a run that read its
        results some other way stops alike."""
        spent = sum((r.usage for r in self.results), UsageTotals())
        self.run.options.budget.check(self.workflow_id, step, spent)

    def _replayed(self, stored: StepRecord, prompt: str) -> StepResult:
        check_same_prompt(stored, prompt)
        result = StepResult.from_record(stored, "stored")
        log_here().info(step_line(self.run, result))
        return result

    async def _run_turn(self, step: int, prompt: str, output: type[BaseModel] | None) -> StepResult:
        state = await self._turn_task(self.run, step, prompt, output, return_state=True)  # type: ignore[misc]
        result: StepResult = await state.aresult()
        if state.name == "Cached":  # Prefect's cache answered: nothing ran this time
            await record_cached_step(self.run, prompt, result)
            result = result.model_copy(update={"verdict": "cached"})
            log_here().info(step_line(self.run, result))
        return result


__all__ = [
    "DurableChat",
    "StoreLost",
    "Structured",
    "Superseded",
    "WorkflowCancelled",
    "WorkflowFinished",
]
