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

Entering begins the workflow: it takes the workflow's next fencing epoch (so a
superseded run can never act again), names the flow run after it, marks the run it
replaces superseded, and keeps a heartbeat for the orphan sweep. A workflow that
ran before is replayed first: its finished steps come from the store and nothing is
taken until the run goes on past them, so a run refused on the way (its code changed)
leaves the workflow exactly as it was. Leaving ends it:
its chat archived and the workflow stored as finished, or, after a definitive
failure, archived and marked failed. A crash ends nothing: the sweep relaunches the
run, and a pause or a suspension ends nothing either (the run resumes where it was).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Generic, TypeVar, overload

from prefect.context import FlowRunContext
from prefect.exceptions import Abort, MissingContextError
from prefect.flow_runs import apause_flow_run, asuspend_flow_run
from prefect.logging.loggers import LoggingAdapter
from prefect.runtime import flow_run as current_flow_run
from pydantic import BaseModel

from coder_chat import CoderConfigError, CoderError, CoderStoreError, is_retryable
from coder_chat.durable.context import StepTools
from coder_chat.durable.records import PromptChanged, StepRecord, WorkflowState
from coder_chat.durable.step import (
    StepResult,
    check_same_prompt,
    check_sent_prompt,
    labelled_chats,
)
from coder_chat.durable.store import FencedOut
from prefect_coder._run.artifacts import Progress, publish_transcript
from prefect_coder._run.ending import (
    archive_idle_chat,
    end_failed_workflow,
    reopen_chat,
    retire_workflow_chat,
)
from prefect_coder._run.imports import ToolLike, resolve_tools
from prefect_coder._run.logs import run_log
from prefect_coder._run.marks import (
    end_cancelled_run,
    end_lost,
    end_superseded,
    marked_superseded,
    supersede,
)
from prefect_coder._run.naming import (
    deployment_name,
    name_the_run,
    replay_name,
    replaying_name,
    run_name,
    slug,
    tag_refused,
    workflow_tag,
)
from prefect_coder._run.pulse import Pulse
from prefect_coder._run.runtime import Ledger, checked_blocks, with_retries
from prefect_coder._run.story import progress_line, step_line, tally
from prefect_coder._run.task_policy import tuned
from prefect_coder._run.workflow import (
    Began,
    Workflow,
    WorkflowRun,
    begin_workflow,
    finish_workflow,
    heartbeat_forever,
    record_cached_step,
    take_epoch,
)
from prefect_coder.blocks import CoderCredentials
from prefect_coder.settings import WorkflowSettings
from prefect_coder.tasks.turns import run_turn

M = TypeVar("M", bound=BaseModel)
A = TypeVar("A", bound=BaseModel)

#: Ends a person may carry a workflow on from (``prefect-coder workflows resume``).
ENDED_BY_FAILURE = frozenset({WorkflowState.FAILED, WorkflowState.CANCELLED})

#: Frozen, so one instance serves every chat that is given no settings.
DEFAULT_SETTINGS = WorkflowSettings()


class Structured(StepResult, Generic[M]):
    """A turn's result whose ``output`` is the structured answer, validated as ``M``."""

    output: M


class Superseded(Abort):
    """This flow run lost its workflow to a newer run: it does nothing more.

    Raised out of the flow once its run is marked *Cancelled: Superseded*, naming
    the run that replaced it; Prefect ends the run there without marking it failed.
    """


class WorkflowCancelled(Abort):
    """A person cancelled this flow run, and the sweep ended its workflow (chat archived,
    stored cancelled) while the run's process was still going: it does nothing more."""


class StoreLost(Abort):
    """This flow run could not reach the durable store through every retry: it ends
    *Crashed*, not failed, and the workflow is left running for the orphan sweep to
    relaunch once the store is back."""


class WorkflowFinished(CoderConfigError):
    """A turn past the end of a workflow that finished and archived its chat."""


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
        self.credentials, self.ledger = checked_blocks(credentials, ledger)
        self.tools = tuple(tools)
        self.settings = settings or DEFAULT_SETTINGS
        self.expected_turns = expected_turns
        self.owns_run = owns_run
        self.results: list[StepResult] = []
        self._prompts: list[str] = []
        #: What the workflow was told between turns, kept in the store, and how much of it
        #: this run has used (the k-th wait is answered by the k-th input).
        self._inputs: list[object] = []
        self._inputs_used = 0
        self._began: Began | None = None
        self._heart: asyncio.Task[None] | None = None
        #: Tells Prefect this run is alive while it holds the workflow (its own flow run's).
        self._pulse: Pulse | None = None
        self._progress: Progress | None = None
        #: Each patch the workflow met and what it decided (``patched``); the names of the
        #: decisions not yet in the store, written before the next turn sends.
        self._patches: dict[str, bool] = {}
        self._unsaved_patches: set[str] = set()
        #: The name of the run this one took over from, when it marked it superseded.
        self.took_over_from: str | None = None
        #: The chat this run archived at the workflow's end (its id), if it did.
        self.archived_chat: str | None = None

    def __repr__(self) -> str:
        return f"DurableChat({self.workflow_id!r}, steps done={len(self.results)})"

    # -- what a flow reads --------------------------------------------------------------
    @property
    def run(self) -> WorkflowRun:
        if self._began is None:
            raise CoderConfigError("use the DurableChat in 'async with' before taking turns")
        return self._began.run

    @property
    def epoch(self) -> int:
        return self.run.epoch

    @property
    def previous_run(self) -> str | None:
        """The flow run that held the workflow before this one, while it was running."""
        return self._began.previous_run if self._began else None

    # -- begin --------------------------------------------------------------------------
    async def __aenter__(self) -> DurableChat:
        log = _log()
        # The workflow is begun even when its tools fail to import, so that the failure
        # still ends it (archived, marked failed) rather than leave it to the sweep.
        failure: CoderError | None = None
        try:
            tools = resolve_tools(self.tools, allow_plain=self.settings.allow_plain_tools)
        except CoderError as exc:
            tools, failure = StepTools(), exc
        began = self._began = await self._begin(
            Workflow(
                self.workflow_id,
                deployment=await deployment_name(),
                flow_run_id=current_flow_run.id,
                credentials=self.credentials,
                ledger=self.ledger,
                settings=self.settings,
                tools=tools,
                expected_turns=self.expected_turns,
                shares_run=not self.owns_run,
            )
        )
        self._inputs = list(began.before.inputs) if began.before else []
        self._patches = dict(began.before.patches) if began.before else {}
        if began.finished_before:
            log.info(
                f"Workflow {self.workflow_id} finished in an earlier run: its finished steps "
                "come from the store, and nothing is sent or written again."
            )
            if self.owns_run and began.run.flow_run_id is not None:
                name = replay_name(self.workflow_id)
                tag = workflow_tag(self.workflow_id)
                await name_the_run(
                    began.run.flow_run_id, current_flow_run.name or "", name, log, tag=tag
                )
            return self
        if began.replay:
            log.info(
                f"Workflow {self.workflow_id}: {len(began.stored)} step(s) finished in earlier "
                "runs come from the store; this run takes the workflow over at its first new "
                "step, and changes nothing before."
            )
            if self.owns_run and began.run.flow_run_id is not None:
                # Named as ours from the start: a long replay is not taken for a run lost
                # before it began (the sweep relaunches those).
                name, tag = replaying_name(self.workflow_id), workflow_tag(self.workflow_id)
                run_id = began.run.flow_run_id
                await name_the_run(run_id, current_flow_run.name or "", name, log, tag=tag)
            if failure is not None:
                await self._end(failure, log)
                raise failure
            return self
        try:
            if failure is not None:
                raise failure
            await self._started(log)
        except BaseException as exc:
            await self._end(exc, log)
            raise
        return self

    async def _begin(self, workflow: Workflow) -> Began:
        try:
            return await begin_workflow(workflow)
        except CoderStoreError as exc:
            await self._lost(exc, _log())
            raise

    async def _lost(self, exc: Exception, log: LoggingAdapter) -> None:
        """If the store was out of reach through every retry, end the run lost (Crashed,
        for the sweep to relaunch), not failed. Returns when it cannot be said so (not
        the store's passing error, the flow's own retries take it again, or Prefect's
        API is out of reach too). In a run of many workflows, :class:`StoreLost` tells
        that run, which ends itself once the others are done."""
        run_id = current_flow_run.id
        passing = isinstance(exc, CoderStoreError) and is_retryable(exc)
        if not passing or not run_id or _will_retry():
            return
        if not self.owns_run:
            raise StoreLost(str(exc)) from exc
        if await end_lost(run_id, str(exc), log):
            raise StoreLost(str(exc)) from exc

    async def _started(self, log: LoggingAdapter) -> None:
        """This run holds the workflow now: beat, and say so where a person looks."""
        run = self.run
        self._heart = asyncio.create_task(heartbeat_forever(run, log.warning))
        if not self.owns_run:
            return
        first = "its first run" if run.epoch == 1 else f"run {run.epoch}"
        log.info(f"Workflow {self.workflow_id}: this is {first} (epoch {run.epoch}).")
        name = run_name(self.workflow_id, run.epoch)
        if run.flow_run_id is not None:
            tag = workflow_tag(self.workflow_id)
            name = await name_the_run(
                run.flow_run_id, current_flow_run.name or "", name, log, tag=tag
            )
            self.took_over_from = await supersede(self.previous_run, run.flow_run_id, name, log)
        self._pulse = Pulse(self.settings.pulse_seconds)
        self._pulse.start(name)
        self._progress = Progress(
            self.workflow_id,
            self.expected_turns,
            key=f"progress-{slug(self.workflow_id)}",
            took_over_from=self.took_over_from,
            lines=[progress_line(r) for r in self.results],  # replayed before it took over
        )
        await self._progress.start()

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
        began = self._began
        if began is None:
            raise CoderConfigError("use the DurableChat in 'async with' before taking turns")
        step = len(self.results) + 1
        stored = began.stored.get(step)
        if stored is not None:
            result = self._replayed(stored, prompt)
        else:
            if began.replay:
                await self._go_on(began, prompt)
            await self._save_patches()
            result = await self._run_turn(step, prompt, output)
        self.results.append(result)
        self._prompts.append(prompt)
        if self._progress is not None:
            await self._progress.advance(progress_line(result))
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
        began = self._began
        if began is None:
            raise CoderConfigError("use the DurableChat in 'async with' before waiting for input")
        number = self._inputs_used + 1
        if number <= len(self._inputs):
            self._inputs_used = number
            _log().info(
                f"{self._input_title(number)}: answered in an earlier run; not asked again."
            )
            return input_type.model_validate(self._inputs[number - 1])
        if began.replay:
            await self._go_on(began)
        _log().info(f"{self._input_title(number)}: waiting for a person's answer.")
        if self._progress is not None:
            how = " (the run is suspended: it leaves its worker until then)" if suspend else ""
            await self._progress.wait(
                f"a person's answer: {input_type.__name__}, input {number}{how}"
            )
        if suspend:
            if self._pulse is not None:
                self._pulse.stop()  # the process leaves; its silence is no death
            answer = await asuspend_flow_run(wait_for_input=input_type, timeout=timeout)
            if self._pulse is not None:
                self._pulse.restart()  # answered already: this run goes on
        else:
            answer = await apause_flow_run(wait_for_input=input_type, timeout=timeout)
        if self._progress is not None:
            self._progress.waiting_for = None  # said with the next step's line
        self._inputs.append(answer.model_dump(mode="json"))
        run, told = self.run, list(self._inputs)
        await with_retries(lambda: run.runtime.store.save_inputs(run.fence, told))
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
        began = self._began
        if began is None:
            raise CoderConfigError("use the DurableChat in 'async with' before asking for patches")
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
        await with_retries(lambda: run.runtime.store.save_patches(run.fence, patches))
        self._unsaved_patches.clear()

    def _input_title(self, number: int) -> str:
        name = f"input {number}"
        return f"{self.workflow_id}, {name}" if not self.owns_run else name[:1].upper() + name[1:]

    def _replayed(self, stored: StepRecord, prompt: str) -> StepResult:
        check_same_prompt(stored, prompt)
        result = StepResult.from_record(stored, "stored")
        _log().info(step_line(self.run, result))
        return result

    async def _run_turn(self, step: int, prompt: str, output: type[BaseModel] | None) -> StepResult:
        turn = tuned(run_turn, self.settings.tasks)
        state = await turn(self.run, step, prompt, output, return_state=True)  # type: ignore[misc]
        result: StepResult = await state.aresult()
        if state.name == "Cached":  # Prefect's cache answered: nothing ran this time
            await record_cached_step(self.run, prompt, result)
            result = result.model_copy(update={"verdict": "cached"})
            _log().info(step_line(self.run, result))
        return result

    async def _go_on(self, began: Began, prompt: str | None = None) -> None:
        """This run goes past what the workflow's earlier runs did, so it takes the
        workflow over (its next epoch). A workflow that finished goes on only when its
        chat was kept (``archive_at_end`` off). ``prompt``: the turn it goes on with,
        checked first against a send of the same step an earlier run left in flight, so
        that a changed prompt is refused before anything is taken."""
        if began.finished_before and (began.before is None or began.before.archive_at_end):
            raise WorkflowFinished(
                f"workflow {self.workflow_id!r} finished after {len(began.stored)} step(s) "
                "and archived its chat, so it takes no more turns; use a new workflow id"
            )
        if prompt is not None:
            await self._refuse_a_changed_send(began, prompt)
        run, before = began.run, began.before
        run.fence = await take_epoch(run.runtime, run.workflow)
        began.replay = False
        await self._started(_log())
        if before is not None and before.state in ENDED_BY_FAILURE and before.chat_id:
            # Resumed after it failed or was cancelled: its chat was archived then.
            chat_id = before.chat_id
            await with_retries(lambda: reopen_chat(run, chat_id, _log().info))

    async def _refuse_a_changed_send(self, began: Began, prompt: str) -> None:
        """Raise :class:`PromptChanged` when an earlier run left this step in flight with
        another prompt (one read of the chat's history, only in that case). A first
        step's send made the chat, so when no checkpoint holds a chat yet (its process
        died first), the chat is the newest labelled with the workflow (one more read)."""
        step, before = len(self.results) + 1, began.before
        if before is None or step in began.stored:
            return
        ctx = began.run.step_context(step, _log().info)
        chat_id = before.chat_id if step == began.last_sent_step else None
        if before.chat_id is None:
            found = await with_retries(lambda: labelled_chats(ctx))
            chat_id = str(found[0].id) if found else None
        if chat_id is None:
            return
        sent_on = chat_id
        await with_retries(lambda: check_sent_prompt(ctx, prompt, sent_on))

    # -- end ----------------------------------------------------------------------------
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._end(exc, _log())

    async def _end(self, exc: BaseException | None, log: LoggingAdapter) -> None:
        await self._stop_beating()
        began = self._began
        if began is None:
            return
        if isinstance(exc, PromptChanged | WorkflowFinished):
            log.error(f"{_capitalised(str(exc))} {self._left_as_it_was(began)}")
            if isinstance(exc, PromptChanged) and current_flow_run.id:
                await tag_refused(current_flow_run.id, log)
            return
        if began.replay:
            if began.finished_before or not _ends_workflow(exc):
                return  # nothing was taken, so nothing is left to end
            # It ran before and this run replayed it to its end (or failed on the way):
            # ending it is acting for it, so this run takes it over first.
            try:
                await self._go_on(began)
            except CoderStoreError as lost:
                await self._lost(lost, log)
                raise
            await self._stop_beating()
        await self._end_held(exc, log)

    async def _end_held(self, exc: BaseException | None, log: LoggingAdapter) -> None:
        """End the workflow this run holds, as ``exc`` (``None``: it finished) says."""
        if exc is None:
            try:
                await self._finished(log)
            except FencedOut as fenced:
                # Its turns all came from the store (a successor had finished them while
                # this run was cut off); ending the workflow is the successor's to do.
                await self._superseded(fenced, log)
            except CoderStoreError as lost:
                # Every turn finished, but the store is gone before the workflow is marked
                # finished: a relaunch finds the turns stored and ends it (Failed would
                # leave it for the sweep to mark failed).
                await self._lost(lost, log)
                raise
        elif isinstance(exc, FencedOut):
            await self._superseded(exc, log)
        elif isinstance(exc, Exception) and not _will_retry():
            if await self._was_superseded():
                await self._superseded(exc, log)  # its failure came after it lost the workflow
            await self._lost(exc, log)
            log.error(f"Workflow {self.workflow_id} failed: {exc}")
            try:
                ended = await end_failed_workflow(self.run, log)
            except FencedOut:
                ended = False
            if not ended:  # a newer run took the workflow while this one was ending it
                await self._superseded(exc, log)
        # Anything else ends nothing: a crash, a cancellation, a pause or suspension
        # (the run resumes), or a failure the flow's own retries take again.

    def _left_as_it_was(self, began: Began) -> str:
        """What a refused run says of the workflow it was refused for."""
        if not began.replay:
            return "The workflow is left as it was."
        return (
            "This run took nothing from the workflow: it is left exactly as it was (its runs, "
            "epoch and state), for its own runs to carry on. To change a prompt for workflows "
            'already past it, put the change behind chat.patched("a-name").'
        )

    async def _finished(self, log: LoggingAdapter) -> None:
        run = self.run
        if self.owns_run and self.results:
            await publish_transcript(self.workflow_id, self._prompts, self.results, log)
        archived = None
        if run.settings.archive_at_end:
            archived = await with_retries(lambda: self._archive(log))
        await finish_workflow(run, WorkflowState.FINISHED)
        self.archived_chat = archived
        if self._progress is not None:
            await self._progress.flush(finished=True)
        if self.owns_run:
            # A run of many workflows says this in its progress artifact, one line each,
            # instead of a log line each (about a millisecond apiece in Prefect's handlers).
            log.info(f"Workflow {self.workflow_id} is finished: {self.summary()}.")

    def summary(self) -> str:
        """``3 step(s), 3 ran; its chat … is archived``: how the workflow ended here."""
        chat = f"; its chat {self.archived_chat} is archived" if self.archived_chat else ""
        return f"{tally(self.results)}{chat}"

    async def _archive(self, log: LoggingAdapter) -> str | None:
        """Archive the chat once, and return its id when it is archived: one request when
        this run's last turn left it idle; else (no turn ran here, or a prompt that landed
        late is running) settle and answer it first, from the ledger, and say what was done."""
        last = self.results[-1] if self.results else None
        # A turn of this run saw the chat settle: archiving it is one request.
        if (
            last is not None
            and last.verdict in ("ran", "recovered", "resubmitted")
            and await archive_idle_chat(self.run, last.chat_id)
        ):
            return last.chat_id
        retired = await retire_workflow_chat(self.run, log.info)
        return retired.chat_id if retired is not None and retired.done else None

    async def _superseded(self, exc: Exception, log: LoggingAdapter) -> None:
        """A newer run holds the workflow: this one does nothing more, and says so.

        Raised out as :class:`Superseded`, so Prefect ends the run *Cancelled:
        Superseded* (naming the run that took over) instead of failed; in a flow run of
        many workflows, as :class:`FencedOut`, for that flow to count.
        """
        run = self.run
        if not self.owns_run or run.flow_run_id is None:
            if isinstance(exc, FencedOut):
                return
            raise FencedOut(run.fence, None) from exc
        successor = None
        with contextlib.suppress(CoderError):  # the store may be out of reach: still over
            newer = await run.guard.newer()
            successor = newer.flow_run_id if newer is not None else None
        if successor == run.flow_run_id:
            # The sweep took the workflow for this very run: a person cancelled it.
            await end_cancelled_run(run.flow_run_id, self.workflow_id, log)
            raise WorkflowCancelled(str(exc)) from exc
        await end_superseded(run.flow_run_id, successor, log)
        raise Superseded(str(exc)) from exc

    async def _was_superseded(self) -> bool:
        """Whether a newer run took the workflow while this one failed: its flow run was
        marked superseded, or the store holds a newer epoch. Unknown counts as no."""
        run = self.run
        if run.flow_run_id is not None and await marked_superseded(run.flow_run_id):
            return True
        try:
            return await run.guard.newer() is not None
        except CoderError:
            return False

    async def _stop_beating(self) -> None:
        if self._pulse is not None:
            self._pulse.stop()
            self._pulse = None
        if self._heart is not None:
            self._heart.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heart
            self._heart = None


def _ends_workflow(exc: BaseException | None) -> bool:
    """Whether leaving the chat this way ends the workflow: it finished, or failed for
    good. A crash, a cancellation, a pause or a failure the flow retries ends nothing."""
    return exc is None or (
        isinstance(exc, Exception) and not isinstance(exc, FencedOut) and not _will_retry()
    )


def _will_retry() -> bool:
    """Whether the flow's own retries will run it again after this failure."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None or context.flow is None:
        return False
    return context.flow_run.run_count <= (context.flow.retries or 0)


def _log() -> LoggingAdapter:
    """The run's logger, or a plain one outside a flow run."""
    try:
        return run_log()
    except MissingContextError:
        return logging.LoggerAdapter(logging.getLogger("prefect_coder"))


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


__all__ = [
    "DurableChat",
    "Structured",
    "Superseded",
    "WorkflowCancelled",
    "WorkflowFinished",
    "tally",
]
